import logging

from sftprof import logs

from sftprof.capture import remote

logs.setup(snakemake.log[0])
result = remote.fetch_report(snakemake.params.remote, snakemake.wildcards.experiment, snakemake.wildcards.window,
                             snakemake.output.html)
logging.info("%s: %d bytes, sha256 %s", result.remote_path, result.size, result.sha256)
