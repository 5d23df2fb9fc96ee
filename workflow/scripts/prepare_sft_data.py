import json
import logging

from sftprof import logs

from sftprof.capture import data
from sftprof.io import atomic_write_text

logs.setup(snakemake.log[0])
outputs = {split: snakemake.output[split] for split in data.SPLITS}
stats = data.prepare_sft_splits(snakemake.input.dolly, outputs, snakemake.params.split, snakemake.params.seed)
atomic_write_text(snakemake.output.stats, json.dumps(stats, indent=2))
logging.info("SFT splits: %s", stats)
