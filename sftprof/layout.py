"""Where the pipeline keeps its files, relative to the working directory.

Patterns with {experiment} and {window} wildcards: the Snakemake rules use them as they are,
and code outside Snakemake (the CLI) fills them with str.format. Inside a capture folder,
report names come from sftprof.capture.nsys.output_pattern and each rank's record from sftprof.capture.rank.
"""

DOLLY_JSONL = "resources/{experiment}/dolly.jsonl"
SFT_SPLIT = "resources/{experiment}/sft/{split}.jsonl"
SFT_STATS = "resources/{experiment}/sft/stats.json"
MODEL_DIR = "resources/{experiment}/model"
# In a checkpoint downloaded from the Hub (model.dir/model.repo): the manifest, written only once
# every file is verified; the Hub's listing of the files, kept for checking them offline; and
# the download's log (the folder may be outside the working directory, so its log goes with it).
MODEL_MANIFEST = "sftprof-manifest.json"
HUB_LISTING = ".sftprof-hub-listing.json"
MODEL_DOWNLOAD_LOG = ".sftprof-download.log"
# HF checkpoints converted to NeMo 2 format, one per model (named after its folder).
NEMO_CHECKPOINT = "resources/nemo-checkpoints/{model}"
WINDOW_DIR = "results/{experiment}/{window}"
CAPTURE_DIR = WINDOW_DIR + "/capture"
# Each rank's nsys export: rankN.sqlite, or rankN.parquetdir where the capturing nsys writes one.
EXPORT_DIR = WINDOW_DIR + "/export"
ANALYSIS_DIR = WINDOW_DIR + "/analysis"
REPORT_HTML = WINDOW_DIR + "/report.html"
COMPARISON_DIR = "results/{experiment}/comparison"
JOB_DIR = "jobs/{experiment}/{window}"
# Where fetched files wait (and partial downloads resume) until a whole capture is verified.
FETCH_STAGING = "resources/fetched/{experiment}/{window}"
LOG_DIR = "logs/{experiment}"
PROFILE_LOG = LOG_DIR + "/{window}/profile.log"
# The logs the workflow's rules write in LOG_DIR itself, beside each window's (and each variant's) log folder.
LOG_NAMES = (
    "compare.log",
    "create_random_model.log",
    "create_tiny_model.log",
    "fetch_dolly.log",
    "link_hub_model.log",
    "make_sample_dataset.log",
    "prepare_sft_data.log",
    "suggest_variants.log",
    "variants.log",
)
# An experiment's variants against it (config `variants:`); each variant's own results are under
# results/{experiment}/{variant}/{window}/ (its experiment name is EXPERIMENT/VARIANT).
VARIANTS_DIR = "results/{experiment}/variants"
# The variants `sftprof suggest` gives for an experiment's first window, as YAML (config suggested_variants).
SUGGESTED_VARIANTS = "results/{experiment}/suggested-variants.yaml"
