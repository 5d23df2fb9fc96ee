import logging

from sftprof import logs

from sftprof.capture import hub

logs.setup(snakemake.log[0])
logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per HTTP request otherwise
data = snakemake.config["experiments"][snakemake.wildcards.experiment]["data"]
try:
    fetched = hub.fetch_dolly(data, snakemake.output.dolly)
except hub.HubError as error:
    logging.error("%s", error)
    raise SystemExit(1)
logging.info("dolly: %s, %d bytes, sha256 %s", fetched["source"], fetched["size"], fetched["sha256"])
