import logging

from sftprof import logs

from sftprof.capture import remote

logs.setup(snakemake.log[0])
fetched = remote.fetch_capture(snakemake.params.remote, snakemake.wildcards.experiment, snakemake.params.experiment,
                               snakemake.wildcards.window, snakemake.output.capture)
for result in fetched:
    logging.info("%s: %d bytes, sha256 %s%s", result.remote_path, result.size, result.sha256,
                 " (already here)" if result.skipped else "")
