"""Llama 2 and dolly downloads (sftprof.capture.hub) through the real huggingface_hub client, against a
stand-in Hub on loopback (tests/hubserver.py): verification, resume, gated access, offline mode,
clear errors and token safety; the dolly conversion's stats; and the download rules in the
workflow, end to end."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import secrets
import shutil
import socket
import types
from contextlib import contextmanager
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants

from sftprof import layout
from sftprof.capture import config, data, hub
from sftprof.capture.model import create_tiny_llama

from conftest import SMALL_DEMO, snakemake, write_config
from hubserver import HubRepo, HubServer

TOKEN = "hf_" + secrets.token_hex(16)  # may read the gated model
OTHER_TOKEN = "hf_" + secrets.token_hex(16)  # a token without access to it
MiB = 2**20
DEFAULTS = config.validate(copy.deepcopy(SMALL_DEMO))["experiments"]["demo"]
LLAMA, LLAMA_REVISION = DEFAULTS["model"]["repo"], DEFAULTS["model"]["revision"]
DOLLY, DOLLY_REVISION, DOLLY_FILE = (DEFAULTS["data"][key] for key in ("repo", "revision", "filename"))


def random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


MODEL_FILES = {
    "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}).encode(),
    "generation_config.json": b'{"do_sample": true}',
    "model-00001-of-00002.safetensors": random_bytes(2 * MiB, 1),
    "model-00002-of-00002.safetensors": random_bytes(1 * MiB, 2),
    "model.safetensors.index.json": b'{"weight_map": {}}',
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer.model": random_bytes(20_000, 3),
    "pytorch_model-00001-of-00002.bin": random_bytes(MiB // 2, 4),
    "README.md": b"# Llama 2\n",
}
# What the default allow_patterns (*.safetensors, *.json, tokenizer.model) select.
WANTED = [
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer.model",
]
BAD_ROWS = [
    ["not", "an", "object"],
    {"instruction": "Name a colour.", "context": "", "category": "open_qa"},
    {"instruction": "Name a colour.", "context": None, "response": "Red.", "category": "open_qa"},
    {"instruction": "   ", "context": "", "response": "Red.", "category": "open_qa"},
    {"instruction": "Name a colour.", "context": "", "response": " \n", "category": "open_qa"},
]
DOLLY_BYTES = "".join(json.dumps(row) + "\n" for row in data.generate_sample(150, 5) + BAD_ROWS).encode()


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_token(path: Path, token: str) -> str:
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture(autouse=True)
def isolated_hf(tmp_path, monkeypatch):
    """No token, cache or offline setting of this machine reaches a test."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "hf-login-token"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def server():
    repos = [
        HubRepo(LLAMA, "model", MODEL_FILES, commit=LLAMA_REVISION, gated_tokens={TOKEN}),
        HubRepo(DOLLY, "dataset", {DOLLY_FILE: DOLLY_BYTES}, commit=DOLLY_REVISION),
    ]
    with HubServer(repos) as running:
        yield running


def experiment_section(section: str, settings: dict) -> dict:
    """`settings` as the config section, with the schema's defaults filled in."""
    cfg = copy.deepcopy(SMALL_DEMO)
    cfg["experiments"]["demo"][section] = {key: value for key, value in settings.items() if value is not None}
    return config.validate(cfg)["experiments"]["demo"][section]


def model_settings(endpoint: str, tmp_path: Path, **changes) -> dict:
    """A hub model from `endpoint` into tmp_path/models, with a token file that has access."""
    return experiment_section(
        "model",
        {
            "source": "hub",
            "endpoint": endpoint,
            "dir": str(tmp_path / "models"),
            "token_file": write_token(tmp_path / "token", TOKEN),
            **changes,
        },
    )


def data_settings(endpoint: str, **changes) -> dict:
    return experiment_section("data", {"source": "hub", "endpoint": endpoint, **changes})


def download(settings: dict) -> dict:
    return hub.download_model(settings, hub.checkpoint_dir(settings))


def checkpoint(settings: dict) -> Path:
    return Path(hub.checkpoint_dir(settings))


# --- the model -------------------------------------------------------------------------------


def test_download_fetches_the_allowed_files_verifies_them_and_writes_the_manifest(server, tmp_path):
    settings = model_settings(server.endpoint, tmp_path)
    manifest = download(settings)
    folder = checkpoint(settings)
    assert folder == tmp_path / "models" / "meta-llama" / "Llama-2-7b-hf"
    assert json.loads((folder / layout.MODEL_MANIFEST).read_text()) == manifest
    assert manifest["repo"] == LLAMA and manifest["revision"] == manifest["commit"] == LLAMA_REVISION
    assert manifest["files"] == [
        {"path": p, "size": len(MODEL_FILES[p]), "sha256": sha256(MODEL_FILES[p])} for p in WANTED
    ]
    assert manifest["total_size"] == sum(len(MODEL_FILES[p]) for p in WANTED)
    assert all((folder / p).read_bytes() == MODEL_FILES[p] for p in WANTED)
    assert not (folder / "README.md").exists() and not (folder / "pytorch_model-00001-of-00002.bin").exists()
    # The token goes to the Hub, and never to the CDN that serves the LFS files.
    files_from_hub = [r for r in server.requests if r.server == "hub" and "/resolve/" in r.path]
    from_cdn = [r for r in server.requests if r.server == "cdn"]
    assert files_from_hub and all(r.authorization == f"Bearer {TOKEN}" for r in files_from_hub)
    assert from_cdn and all(r.authorization is None for r in from_cdn)


@pytest.mark.parametrize(
    "token_file, hf_token, login_token",
    [
        (TOKEN, None, None),
        (None, TOKEN, None),
        (None, None, TOKEN),
        (TOKEN, OTHER_TOKEN, OTHER_TOKEN),  # the token file wins
    ],
    ids=["token_file", "HF_TOKEN", "hf-auth-login", "token_file-first"],
)
def test_token_comes_from_the_token_file_then_hf_token_then_the_login(
    server, tmp_path, monkeypatch, token_file, hf_token, login_token
):
    if hf_token:
        monkeypatch.setenv("HF_TOKEN", hf_token)
    if login_token:
        Path(hf_constants.HF_TOKEN_PATH).write_text(login_token)
    path = write_token(tmp_path / "token-file", token_file) if token_file else None
    download(model_settings(server.endpoint, tmp_path, token_file=path))
    assert {r.authorization for r in server.requests if "/resolve/" in r.path} == {f"Bearer {TOKEN}"}


def test_gated_model_without_a_token_says_how_to_give_one(server, tmp_path):
    settings = model_settings(server.endpoint, tmp_path, token_file=None)
    with pytest.raises(hub.HubError) as error:
        download(settings)
    message = str(error.value)
    assert "gated and no token was given" in message and "HF_TOKEN" in message and "model.token_file" in message
    assert not (checkpoint(settings) / layout.MODEL_MANIFEST).exists() and server.bodies == []


def test_token_without_access_to_the_gated_model_is_refused_clearly(server, tmp_path):
    settings = model_settings(server.endpoint, tmp_path, token_file=write_token(tmp_path / "other", OTHER_TOKEN))
    with pytest.raises(hub.HubError) as error:
        download(settings)
    message = str(error.value)
    assert "the token has no access" in message and f"{server.endpoint}/{LLAMA}" in message
    assert OTHER_TOKEN not in message
    assert not (checkpoint(settings) / layout.MODEL_MANIFEST).exists() and server.bodies == []


def test_unknown_revision_names_it(server, tmp_path):
    with pytest.raises(hub.HubError) as error:
        download(model_settings(server.endpoint, tmp_path, revision="v9.9"))
    assert "no revision 'v9.9'" in str(error.value) and "model.revision" in str(error.value)
    assert server.bodies == []


def test_unreachable_hub_points_to_offline_mode(tmp_path):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(hub.HubError) as error:
        download(model_settings(endpoint, tmp_path))
    message = str(error.value)
    assert f"cannot reach {endpoint}" in message and "model.offline: true" in message and "HF_HUB_OFFLINE" in message


def test_dropped_connection_resumes_where_it_stopped_and_the_file_is_verified(tmp_path):
    weights = random_bytes(24 * MiB, 9)
    files = {"config.json": b"{}", "model.safetensors": weights}
    with HubServer([HubRepo(LLAMA, "model", files, commit=LLAMA_REVISION)]) as server:
        server.drop_once("model.safetensors", after_bytes=15 * MiB)
        manifest = download(model_settings(server.endpoint, tmp_path))
    first, resumed = server.downloads("model.safetensors")
    assert first is None and resumed.startswith("bytes=") and resumed.endswith("-")
    # huggingface_hub writes 10 MiB chunks: it asks for the rest after the last whole chunk.
    assert 0 < int(resumed[len("bytes=") : -1]) <= 15 * MiB
    assert {f["path"]: f["sha256"] for f in manifest["files"]}["model.safetensors"] == sha256(weights)


def test_corrupt_download_is_reported_and_fetched_again(server, tmp_path, caplog):
    settings = model_settings(server.endpoint, tmp_path)
    server.corrupt("tokenizer.model")
    download(settings)
    assert len(server.downloads("tokenizer.model")) == 2
    assert (checkpoint(settings) / "tokenizer.model").read_bytes() == MODEL_FILES["tokenizer.model"]
    assert f"tokenizer.model: sha256 {sha256(bytes(b ^ 0xFF for b in MODEL_FILES['tokenizer.model']))}" in caplog.text
    assert "fetching it again" in caplog.text


def test_damaged_file_already_on_disk_is_detected_and_fetched_again(server, tmp_path):
    """huggingface_hub hands back a file it downloaded before without reading it; the hash check does."""
    settings = model_settings(server.endpoint, tmp_path)
    download(settings)
    shard = checkpoint(settings) / "model-00002-of-00002.safetensors"
    shard.write_bytes(b"\0" * shard.stat().st_size)
    (checkpoint(settings) / layout.MODEL_MANIFEST).unlink()  # as Snakemake does before rerunning
    before = {path: len(server.downloads(path)) for path in WANTED}
    download(settings)
    assert shard.read_bytes() == MODEL_FILES["model-00002-of-00002.safetensors"]
    assert {path: len(server.downloads(path)) - before[path] for path in WANTED} == {
        path: int(path == shard.name) for path in WANTED
    }


def test_file_still_wrong_after_a_second_download_fails_without_a_manifest(server, tmp_path):
    settings = model_settings(server.endpoint, tmp_path)
    server.corrupt("config.json", times=2)  # a git-stored file: checked by its git blob sha1
    with pytest.raises(hub.HubError) as error:
        download(settings)
    assert "config.json: still wrong after a second download (git blob sha1" in str(error.value)
    assert not (checkpoint(settings) / layout.MODEL_MANIFEST).exists()


def test_failed_run_keeps_the_finished_files_and_the_next_fetches_only_the_rest(server, tmp_path):
    settings = model_settings(server.endpoint, tmp_path)
    server.fail_once("model-00001-of-00002.safetensors")
    with pytest.raises(hub.HubError) as error:
        download(settings)
    assert "HTTP 500" in str(error.value) and not (checkpoint(settings) / layout.MODEL_MANIFEST).exists()
    before = {path: len(server.downloads(path)) for path in WANTED}
    download(settings)
    assert {path: len(server.downloads(path)) - before[path] for path in WANTED} == {
        path: int(path == "model-00001-of-00002.safetensors") for path in WANTED
    }


def test_short_disk_space_stops_the_download_before_it_starts(server, tmp_path, monkeypatch):
    free = 1_000_000
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: types.SimpleNamespace(total=10 * free, used=9 * free, free=free)
    )
    settings = model_settings(server.endpoint, tmp_path)
    with pytest.raises(hub.HubError) as error:
        download(settings)
    needed = sum(len(MODEL_FILES[p]) for p in WANTED) / 1e6
    assert f"needs {needed:.2f} MB more" in str(error.value) and "has 1.00 MB free" in str(error.value)
    assert server.bodies == []


@pytest.mark.parametrize("switch", ["model.offline", "HF_HUB_OFFLINE"])
def test_offline_checks_the_files_already_there_without_the_network(server, tmp_path, monkeypatch, switch):
    settings = model_settings(server.endpoint, tmp_path)
    online = download(settings)
    (checkpoint(settings) / layout.MODEL_MANIFEST).unlink()
    requests = len(server.requests)
    if switch == "HF_HUB_OFFLINE":
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    else:
        settings = {**settings, "offline": True}
    assert download(settings) == online
    assert len(server.requests) == requests


def test_offline_with_a_missing_file_names_it(server, tmp_path):
    settings = model_settings(server.endpoint, tmp_path)
    download(settings)
    (checkpoint(settings) / layout.MODEL_MANIFEST).unlink()
    (checkpoint(settings) / "tokenizer.model").unlink()
    with pytest.raises(hub.HubError) as error:
        download({**settings, "offline": True})
    assert "not a complete, intact download" in str(error.value) and "tokenizer.model: missing" in str(error.value)
    assert not (checkpoint(settings) / layout.MODEL_MANIFEST).exists()


def test_offline_without_a_download_says_where_to_get_one(tmp_path):
    settings = model_settings("http://127.0.0.1:9", tmp_path, offline=True)
    with pytest.raises(hub.HubError) as error:
        download(settings)
    assert f"{checkpoint(settings)} holds no download of {LLAMA}" in str(error.value)


def test_experiment_model_folder_links_to_the_checkpoint_relative_or_absolute_as_configured(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shared = tmp_path / "shared" / "meta-llama" / "Llama-2-7b-hf"
    for checkpoint_path, link in (
        (str(shared), "resources/a/model"),
        ("resources/models/meta-llama/Llama-2-7b-hf", "resources/b/model"),
    ):
        Path(checkpoint_path).mkdir(parents=True)
        hub.link_checkpoint(checkpoint_path, link)
        assert os.readlink(link) == (
            checkpoint_path if os.path.isabs(checkpoint_path) else "../models/meta-llama/Llama-2-7b-hf"
        )
        assert Path(link).resolve() == Path(checkpoint_path).resolve()


# --- dolly -------------------------------------------------------------------------------------


def test_dolly_from_the_hub_is_verified_and_its_sha256_logged_to_be_recorded(server, tmp_path, caplog):
    out = tmp_path / "dolly.jsonl"
    fetched = hub.fetch_dolly(data_settings(server.endpoint), out)
    assert out.read_bytes() == DOLLY_BYTES
    assert fetched["sha256"] == sha256(DOLLY_BYTES) and fetched["size"] == len(DOLLY_BYTES)
    assert f"SHA-256 is {sha256(DOLLY_BYTES)}: record it as data.sha256" in caplog.text


def test_dolly_is_checked_against_the_recorded_sha256(server, tmp_path, caplog):
    hub.fetch_dolly(data_settings(server.endpoint, sha256=sha256(DOLLY_BYTES)), tmp_path / "right.jsonl")
    assert "record it" not in caplog.text
    wrong = "0" * 64
    with pytest.raises(hub.HubError) as error:
        hub.fetch_dolly(data_settings(server.endpoint, sha256=wrong), tmp_path / "wrong.jsonl")
    assert f"SHA-256 {sha256(DOLLY_BYTES)}, but data.sha256 is {wrong}" in str(error.value)
    assert not (tmp_path / "wrong.jsonl").exists()


def test_dolly_corrupted_in_transfer_is_fetched_again(server, tmp_path):
    server.corrupt(DOLLY_FILE)
    hub.fetch_dolly(data_settings(server.endpoint), tmp_path / "dolly.jsonl")
    assert (tmp_path / "dolly.jsonl").read_bytes() == DOLLY_BYTES and len(server.downloads(DOLLY_FILE)) == 2


def test_dolly_offline_comes_from_the_hf_cache_or_fails_clearly(server, tmp_path, monkeypatch):
    hub.fetch_dolly(data_settings(server.endpoint), tmp_path / "online.jsonl")
    requests = len(server.requests)
    hub.fetch_dolly(data_settings(server.endpoint, offline=True), tmp_path / "offline.jsonl")
    assert (tmp_path / "offline.jsonl").read_bytes() == DOLLY_BYTES and len(server.requests) == requests
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(hub.HubError) as error:
        hub.fetch_dolly(data_settings(server.endpoint, offline=True), tmp_path / "missing.jsonl")
    assert f"is not in the HF cache {tmp_path / 'empty-cache'}" in str(error.value)


def test_dolly_unknown_revision_names_it(server, tmp_path):
    with pytest.raises(hub.HubError) as error:
        hub.fetch_dolly(data_settings(server.endpoint, revision="nope"), tmp_path / "dolly.jsonl")
    assert "no revision 'nope'" in str(error.value) and "data.revision" in str(error.value)


def test_dolly_from_a_mirror_url_or_a_local_copy_gets_no_token(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    url = f"{server.endpoint}/datasets/{DOLLY}/resolve/{DOLLY_REVISION}/{DOLLY_FILE}"
    recorded = sha256(DOLLY_BYTES)
    hub.fetch_dolly(data_settings(None, source="path", path=url, sha256=recorded), tmp_path / "from-url.jsonl")
    assert (tmp_path / "from-url.jsonl").read_bytes() == DOLLY_BYTES
    assert server.requests and all(r.authorization is None for r in server.requests)
    local = tmp_path / "copy.jsonl"
    local.write_bytes(DOLLY_BYTES)
    fetched = hub.fetch_dolly(
        data_settings(None, source="path", path=str(local), sha256=recorded), tmp_path / "from-copy.jsonl"
    )
    assert fetched["sha256"] == recorded and (tmp_path / "from-copy.jsonl").read_bytes() == DOLLY_BYTES


def test_conversion_counts_bad_rows_by_reason_and_reports_lengths(tmp_path):
    source = tmp_path / "dolly.jsonl"
    source.write_bytes(DOLLY_BYTES)
    out = {split: tmp_path / f"{split}.jsonl" for split in data.SPLITS}
    stats = data.prepare_sft_splits(source, out, {"training": 0.8, "validation": 0.15, "test": 0.05}, seed=1)
    assert stats["source_sha256"] == sha256(DOLLY_BYTES)
    assert stats["records_read"] == 155 and stats["records_skipped"] == 5
    assert stats["records_skipped_by_reason"] == {
        "not_an_object": 1,
        "missing_field": 2,
        "empty_instruction": 1,
        "empty_response": 1,
    }
    assert sum(stats["records_per_split"].values()) == 150
    assert "not model tokens" in stats["length_measure"]
    for split, path in out.items():
        texts = [row["input"] + row["output"] for row in map(json.loads, path.read_text().splitlines())]
        lengths = stats["lengths"][split]
        assert lengths["words"]["max"] == max(len(text.split()) for text in texts)
        assert lengths["bytes"]["max"] == max(len(text.encode()) for text in texts)
        assert lengths["words"]["p50"] <= lengths["words"]["p90"] <= lengths["words"]["p99"] <= lengths["words"]["max"]


def test_percentiles_are_nearest_rank():
    assert data.percentiles(list(range(100, 0, -1))) == {"p50": 50, "p90": 90, "p99": 99, "max": 100}
    assert data.percentiles([7]) == {"p50": 7, "p90": 7, "p99": 7, "max": 7}
    assert data.percentiles([]) is None


# --- config ------------------------------------------------------------------------------------


def test_config_rules_for_hub_and_path_sources():
    with pytest.raises(config.ConfigError, match=r"experiments\.demo\.data\.path: data\.source path needs"):
        experiment_section("data", {"source": "path"})
    with pytest.raises(config.ConfigError, match=r"experiments\.demo\.data\.sha256"):
        experiment_section("data", {"source": "hub", "sha256": "ABC"})
    # A hub model has no tiny-model shape to check.
    assert experiment_section("model", {"source": "hub", "hidden_size": 30, "num_heads": 4})["source"] == "hub"
    cfg = copy.deepcopy(SMALL_DEMO)
    cfg["experiments"]["other"] = copy.deepcopy(cfg["experiments"]["demo"])
    cfg["experiments"]["demo"]["model"] = {"source": "hub", "dir": "/shared/models"}
    cfg["experiments"]["other"]["model"] = {"source": "hub", "dir": "/shared/models/", "revision": "main"}
    with pytest.raises(
        config.ConfigError,
        match=r"experiments\.other\.model: .*/shared/models/meta-llama/"
        r"Llama-2-7b-hf.*another model\.dir",
    ):
        config.validate(cfg)


# --- the workflow ------------------------------------------------------------------------------


def tiny_llama_files(folder: Path) -> dict[str, bytes]:
    """A real (tiny) Llama checkpoint, so that the workflow can train on what it downloads."""
    create_tiny_llama(DEFAULTS["model"], folder)
    files = {path.name: path.read_bytes() for path in folder.iterdir()}
    return files | {"pytorch_model.bin": random_bytes(4096, 7), "README.md": b"# Llama 2\n"}


def hub_config(endpoint: str, model_dir: Path, token_file: str | None) -> dict:
    cfg = copy.deepcopy(SMALL_DEMO)
    demo = cfg["experiments"]["demo"]
    demo["data"] = {"source": "hub", "endpoint": endpoint, "sha256": sha256(DOLLY_BYTES)}
    demo["model"] = {"source": "hub", "endpoint": endpoint, "dir": str(model_dir)}
    if token_file:
        demo["model"]["token_file"] = token_file
    return cfg


@contextmanager
def hub_env(hf_home: Path, **variables: str):
    """Snakemake (which inherits this environment) runs with HF_HOME and `variables` as its
    only Hugging Face settings."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith(("HF_", "HUGGING_FACE"))]:
            patch.delenv(name)
        for name, value in {"HF_HOME": str(hf_home), **variables}.items():
            patch.setenv(name, value)
        yield


def files_holding(needle: str, *roots: Path) -> list[Path]:
    """Files (under folders, or given) whose bytes contain `needle`."""
    files = [path for root in roots for path in ([root] if root.is_file() else root.rglob("*"))]
    return [path for path in files if path.is_file() and not path.is_symlink() and needle.encode() in path.read_bytes()]


@pytest.fixture(scope="module")
def hub_run(tmp_path_factory):
    """The whole workflow on dolly and a (tiny) Llama checkpoint from the stand-in Hub, the model
    gated and read with a token file while HF_TOKEN holds a token without access."""
    base = tmp_path_factory.mktemp("hub-workflow")
    repos = [
        HubRepo(LLAMA, "model", tiny_llama_files(base / "source-model"), commit=LLAMA_REVISION, gated_tokens={TOKEN}),
        HubRepo(DOLLY, "dataset", {DOLLY_FILE: DOLLY_BYTES}, commit=DOLLY_REVISION),
    ]
    with HubServer(repos) as server:
        workdir, model_dir, hf_home = base / "work", base / "shared-models", base / "hf-home"
        workdir.mkdir()
        cfg = hub_config(server.endpoint, model_dir, write_token(base / "token", TOKEN))
        write_config(workdir, cfg)
        with hub_env(hf_home, HF_TOKEN=OTHER_TOKEN):
            result = snakemake(workdir)
        yield types.SimpleNamespace(
            server=server,
            workdir=workdir,
            model_dir=model_dir,
            hf_home=hf_home,
            config=cfg,
            result=result,
            checkpoint=model_dir / "meta-llama" / "Llama-2-7b-hf",
        )


@pytest.mark.e2e
def test_workflow_downloads_dolly_and_llama_verifies_them_and_trains_on_them(hub_run):
    workdir, checkpoint_dir = hub_run.workdir, hub_run.checkpoint
    manifest = json.loads((checkpoint_dir / layout.MODEL_MANIFEST).read_text())
    files = hub_run.server.repos[("model", LLAMA)].files
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {
        path: sha256(content) for path, content in files.items() if path.endswith((".json", ".safetensors"))
    }
    model_link = workdir / "resources" / "demo" / "model"
    assert model_link.is_symlink() and model_link.resolve() == checkpoint_dir
    assert (workdir / "resources" / "demo" / "dolly.jsonl").read_bytes() == DOLLY_BYTES
    stats = json.loads((workdir / "resources" / "demo" / "sft" / "stats.json").read_text())
    assert stats["records_skipped"] == len(BAD_ROWS) and stats["source_sha256"] == sha256(DOLLY_BYTES)
    assert (workdir / "results" / "demo" / "steady" / "report.html").is_file()
    assert "download_model" in hub_run.result.stdout + hub_run.result.stderr
    with hub_env(hub_run.hf_home, HF_TOKEN=OTHER_TOKEN):
        rerun = snakemake(workdir)
    assert "Nothing to be done" in rerun.stdout + rerun.stderr


def dry_run(hub_run, config: dict) -> str:
    write_config(hub_run.workdir, config)
    with hub_env(hub_run.hf_home):
        result = snakemake(hub_run.workdir, "-n")
    return result.stdout + result.stderr


@pytest.mark.e2e
def test_how_files_are_fetched_redownloads_nothing_and_what_they_are_does(hub_run):
    access = {"endpoint": "http://127.0.0.1:9", "offline": True, "token_file": "/elsewhere/token"}
    changed = copy.deepcopy(hub_run.config)
    try:
        changed["experiments"]["demo"]["data"] |= access
        assert "Nothing to be done" in dry_run(hub_run, changed)
        changed["experiments"]["demo"]["model"] |= access
        planned = dry_run(hub_run, changed)
        # (profile_sft is planned here: its params hold the whole model section, access keys too.)
        assert "download_model" not in planned and "link_hub_model" not in planned
        changed["experiments"]["demo"]["data"]["revision"] = "main"
        planned = dry_run(hub_run, changed)
        assert "fetch_dolly" in planned and "prepare_sft_data" in planned and "download_model" not in planned
    finally:
        write_config(hub_run.workdir, hub_run.config)


@pytest.mark.e2e
def test_no_token_is_written_to_any_output(hub_run):
    """Neither token is in what the run printed or wrote (logs, .snakemake metadata, resources,
    the model store, the HF cache, results), except the one in HF_TOKEN in the nsys captures:
    see the next test."""
    used = {r.authorization for r in hub_run.server.requests if "/resolve/" in r.path}
    assert f"Bearer {TOKEN}" in used  # the token was read and sent, so it could have leaked
    everything_but_results = [
        hub_run.model_dir,
        hub_run.hf_home,
        *(path for path in hub_run.workdir.iterdir() if path.name != "results"),
    ]
    for token in (TOKEN, OTHER_TOKEN):
        assert token not in hub_run.result.stdout + hub_run.result.stderr
        assert files_holding(token, *everything_but_results) == []
    assert files_holding(TOKEN, hub_run.workdir / "results") == []


@pytest.mark.e2e
@pytest.mark.xfail(
    strict=True,
    reason="nsys 2022.4 records an environment holding HF_TOKEN even when the "
    "variable is removed from nsys's own environment and the profiled program's (seen with a "
    "fresh session too): an exported HF_TOKEN lands in the SQLite export. Use token_file.",
)
def test_hf_token_in_the_environment_stays_out_of_the_nsys_captures(hub_run):
    assert files_holding(OTHER_TOKEN, hub_run.workdir / "results") == []


@pytest.mark.e2e
def test_offline_compute_node_uses_the_shared_store_without_the_network(hub_run, tmp_path):
    """A store filled elsewhere (here: a copy without its manifest), HF_HUB_OFFLINE=1: the
    checkpoint is verified and the data comes from the HF cache, with no request to the Hub."""
    model_dir, hf_home = tmp_path / "store", tmp_path / "hf-home"
    shutil.copytree(hub_run.model_dir, model_dir, symlinks=True)
    shutil.copytree(hub_run.hf_home, hf_home, symlinks=True)
    (model_dir / "meta-llama" / "Llama-2-7b-hf" / layout.MODEL_MANIFEST).unlink()
    workdir = tmp_path / "work"
    workdir.mkdir()
    write_config(workdir, hub_config(hub_run.server.endpoint, model_dir, token_file=None))
    requests = len(hub_run.server.requests)
    with hub_env(hf_home, HF_HUB_OFFLINE="1"):
        snakemake(workdir, "resources/demo/model", "resources/demo/sft/training.jsonl")
    assert len(hub_run.server.requests) == requests
    manifest = model_dir / "meta-llama" / "Llama-2-7b-hf" / layout.MODEL_MANIFEST
    assert manifest.read_text() == (hub_run.checkpoint / layout.MODEL_MANIFEST).read_text()
    assert (workdir / "resources" / "demo" / "model").resolve() == manifest.parent


@pytest.mark.e2e
def test_gated_model_without_a_token_stops_the_workflow_clearly(hub_run, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    write_config(workdir, hub_config(hub_run.server.endpoint, tmp_path / "store", token_file=None))
    with hub_env(tmp_path / "hf-home"):
        result = snakemake(workdir, "resources/demo/model", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "is gated and no token was given. Set HF_TOKEN, or model.token_file" in output
    assert not (tmp_path / "store" / "meta-llama" / "Llama-2-7b-hf" / layout.MODEL_MANIFEST).exists()
    assert not (workdir / "resources" / "demo" / "model").exists()
