import logging

from sftprof import logs

from sftprof.capture import hub

logs.setup(snakemake.log[0])
logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per HTTP request otherwise
checkpoint = snakemake.wildcards.checkpoint
try:
    manifest = hub.download_model(hub.hub_model_settings(snakemake.config, checkpoint), checkpoint)
except hub.HubError as error:
    logging.error("%s", error)
    raise SystemExit(1)
logging.info("%s at commit %s: %d files, %d bytes, verified", manifest["repo"], manifest["commit"],
             len(manifest["files"]), manifest["total_size"])
