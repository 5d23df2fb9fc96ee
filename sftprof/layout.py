"""Where the pipeline keeps its files, relative to the working directory.

Patterns with {experiment}, {window} and {report} wildcards: the Snakemake rules use them as
they are, and code outside Snakemake (the CLI) fills them with str.format.
"""

DOLLY_JSONL = "resources/{experiment}/dolly.jsonl"
SFT_SPLIT = "resources/{experiment}/sft/{split}.jsonl"
SFT_STATS = "resources/{experiment}/sft/stats.json"
MODEL_DIR = "resources/{experiment}/model"
WINDOW_DIR = "results/{experiment}/{window}"
NSYS_REPORT = WINDOW_DIR + "/{report}.nsys-rep"
NSYS_SQLITE = WINDOW_DIR + "/{report}.sqlite"
METRICS = WINDOW_DIR + "/{report}.metrics.jsonl"
ANALYSIS_DIR = WINDOW_DIR + "/analysis"
REPORT_HTML = WINDOW_DIR + "/report.html"
LOG_DIR = "logs/{experiment}"
