"""`ckpt-guard hub fix` and `hub webhook --fix`: the real huggingface_hub client against the stand-in Hub.

A repository saved the way users save one (``torch.save`` of a bf16 state dict as a pickle-only
``pytorch_model.bin``, a config.json that says float32) gets ONE pull request with every fixed
file, and never a second: not on a second run, not after it is merged, not when the commit
request is refused with 429 (even after the Hub made the commit), not from the reviewer when
the pull request's own push arrives.  A token that cannot write fails before any download.
The job queue keys jobs by the Hub endpoint too, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("huggingface_hub")
torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from hub_postgres import postgres_server, postgres_url  # noqa: E402,F401 - fixtures
from hub_standin import StandinHub, standin_fixture  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.hub.access import refusal_of  # noqa: E402
from guard.hub.proposal import MARKER_PREFIX, TITLE_PREFIX  # noqa: E402
from guard.hub.queue import Job, open_queue  # noqa: E402

REPO = "org/llama"
HOSTILE = "<img src=x onerror=alert(1)>|**bold**](http://evil)\n# heading `tick`"


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def pickled(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def llama_files() -> dict[str, bytes]:
    """A bf16 model saved as a pickle only, whose config.json says float32: CG103 and CG008."""
    generator = torch.Generator().manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(512, 256, generator=generator).to(torch.bfloat16),
             "model.norm.weight": torch.ones(256, dtype=torch.bfloat16),
             "lm_head.weight": torch.randn(512, 256, generator=generator).to(torch.bfloat16)}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "torch_dtype": "float32", "vocab_size": 512}
    return {"config.json": json.dumps(config, indent=2).encode() + b"\n", "pytorch_model.bin": pickled(state),
            "README.md": b"# llama\n"}


@pytest.fixture
def llama(standin: StandinHub) -> str:
    standin.add_repo(REPO, llama_files())
    return REPO


def pull_requests(hub: StandinHub, repo: str) -> list[Any]:
    return [d for d in hub.repos[repo].discussions if d.is_pr]


def downloaded(hub: StandinHub, repo: str) -> set[str]:
    """Files of ``repo`` whose every byte was sent by /resolve/ GETs (whole, or range by range)."""
    sizes = {name: len(data) for name, data in hub.files_at(repo).items()}
    sent: dict[str, int] = {}
    for record in hub.matching(method="GET", contains=f"/{repo}/resolve/"):
        name = record.path.split("/resolve/", 1)[1].split("/", 1)[1]
        sent[name] = sent.get(name, 0) + record.bytes
    return {name for name, count in sent.items() if count >= sizes.get(name, 0)}


def fix(*args: str) -> int:
    return main(["hub", "fix", *args])


BF16 = ("--expect", "bf16")  # the llama is a bf16 model: only its config.json and its pickle need fixing


# ---------------------------------------------------------------- the dry run


def test_dry_run_prints_the_plan_and_downloads_nothing(standin: StandinHub, llama: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert fix(llama) == 1
    out = capsys.readouterr().out
    assert "CG103" in out and "CG008" in out and "org/llama/model.safetensors" in out
    assert downloaded(standin, llama) <= {"config.json"}  # the scan's own read of config.json, no weights
    assert not standin.matching(method="POST") and not pull_requests(standin, llama)


def test_a_clean_repository_has_nothing_to_fix(standin: StandinHub, capsys: pytest.CaptureFixture[str]) -> None:
    standin.add_repo("org/clean", {"model.safetensors": safetensors_numpy.save({"w": np.ones((2, 2), np.float32)}),
                                   "config.json": b'{"torch_dtype": "float32"}'})
    assert fix("org/clean", "--token", "hf_bot", "--create-pr") == 0
    assert "nothing to fix" in capsys.readouterr().out
    assert not standin.repos["org/clean"].discussions


# ---------------------------------------------------------------- one pull request, once


def test_one_pull_request_with_every_file(standin: StandinHub, llama: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load

    main_before = standin.files_at(llama)
    assert fix(llama, *BF16, "--token", "hf_bot", "--create-pr", "--format", "json") == 0  # the PR's head scans clean
    captured = capsys.readouterr()
    [pr] = pull_requests(standin, llama)
    assert pr.author == "ckpt-guard-bot" and pr.title.startswith(TITLE_PREFIX) and MARKER_PREFIX in pr.description
    files = standin.files_at(llama, pr.ref)
    assert set(files) - set(main_before) == {"model.safetensors"}
    assert files["config.json"] == main_before["config.json"].replace(b'"float32"', b'"bfloat16"')
    expected = torch.load(io.BytesIO(main_before["pytorch_model.bin"]), weights_only=True)
    copied = load(files["model.safetensors"])
    assert copied.keys() == expected.keys() and all(torch.equal(copied[k], expected[k]) for k in expected)
    assert standin.files_at(llama) == main_before  # main untouched
    [(_, ref, header, _)] = standin.received_commits  # one commit, every file in it
    assert ref == pr.ref and header.get("parentCommit") == standin.repos[llama].refs["main"]
    # only what the fixes read was downloaded
    assert downloaded(standin, llama) == {"config.json", "pytorch_model.bin"}
    # the description: the table of fixes, the report after and before
    assert "| finding | fix | writes | result |" in pr.description and "CG008" in pr.description
    assert "After this pull request" in pr.description and "Before: commit" in pr.description
    report = json.loads(captured.out)
    assert report["extra"]["fix"]["status"] == "opened"
    assert report["extra"]["fix"]["files"] == ["config.json", "model.safetensors"]
    assert report["extra"]["fix"]["pull_request"]["num"] == pr.num
    assert not {"CG008", "CG103"} & {f["code"] for f in report["findings"]}  # the after report
    assert "opened pull request" in captured.err


def test_a_second_run_and_a_merged_fix_open_nothing(standin: StandinHub, llama: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert fix(llama, *BF16, "--token", "hf_bot", "--create-pr") == 0
    commits = len(standin.received_commits)
    capsys.readouterr()
    assert fix(llama, *BF16, "--token", "hf_bot", "--create-pr") == 0
    assert "already proposes" in capsys.readouterr().out
    assert len(pull_requests(standin, llama)) == 1 and len(standin.received_commits) == commits
    standin.merge_pull_request(llama, 1)
    assert fix(llama, *BF16, "--token", "hf_bot", "--create-pr") == 0
    assert "nothing to fix" in capsys.readouterr().out
    assert fix(llama, *BF16) == 0  # the dry run agrees
    assert len(pull_requests(standin, llama)) == 1 and len(standin.received_commits) == commits


@pytest.mark.parametrize("after", [False, True], ids=["refused-before-the-commit", "refused-after-the-commit"])
def test_a_429_on_the_commit_never_opens_two_pull_requests(standin: StandinHub, llama: str, after: bool) -> None:
    # 429 with Retry-After on preupload (before any commit), then on the commit request itself; with
    # `after`, the Hub made the commit and the pull request, and answered 429 anyway
    standin.fail("POST", "/preupload/", 429, headers={"Retry-After": "0"})
    standin.fail("POST", "/commit/", 429, headers={"Retry-After": "0"}, after=after)
    assert fix(llama, *BF16, "--token", "hf_bot", "--create-pr") == 0
    [pr] = pull_requests(standin, llama)
    assert "model.safetensors" in standin.files_at(llama, pr.ref)
    commits = [r.status for r in standin.matching(method="POST", contains="/commit/")]
    assert commits == ([429] if after else [429, 200])  # after: the marker was found, nothing sent again
    assert [r.status for r in standin.matching(method="POST", contains="/preupload/")][:2] == [429, 200]


def test_a_server_error_on_the_commit_is_not_repeated(standin: StandinHub, llama: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    standin.fail("POST", "/commit/", 502)  # the Hub may have made the commit: never sent twice
    assert fix(llama, *BF16, "--token", "hf_bot", "--create-pr") == 2
    err = capsys.readouterr().err
    assert "HTTP 502" in err and err.count("\n") == 1
    assert len(standin.matching(method="POST", contains="/commit/")) == 1
    assert fix(llama, *BF16, "--token", "hf_bot", "--create-pr") == 0  # a later run opens it
    assert len(pull_requests(standin, llama)) == 1


def test_add_a_variant_the_repository_lacks(standin: StandinHub) -> None:
    from safetensors.numpy import load

    weights = np.linspace(-2, 2, 64 * 64, dtype=np.float32).reshape(64, 64)
    standin.add_repo("org/bert", {"config.json": b'{"model_type": "bert", "torch_dtype": "float32"}\n',
                                  "model.safetensors": safetensors_numpy.save({"w": weights})})
    assert fix("org/bert", "--add", "variant:fp16") == 1  # the dry run: something to do
    assert fix("org/bert", "--add", "variant:fp16", "--token", "hf_bot", "--create-pr") == 0
    [pr] = pull_requests(standin, "org/bert")
    added = load(standin.files_at("org/bert", pr.ref)["model.fp16.safetensors"])
    assert added["w"].dtype == np.float16 and np.array_equal(added["w"], weights.astype(np.float16))


# ---------------------------------------------------------------- who may open it


@pytest.mark.parametrize("args, message", [
    (["--token", "hf_reader"], "read-only token"),
    ([], "no Hub token"),
    (["--token", "hf_unknown"], "refused the token"),
])
def test_a_token_that_cannot_write_fails_before_any_download(standin: StandinHub, llama: str,
                                                             capsys: pytest.CaptureFixture[str],
                                                             args: list[str], message: str) -> None:
    assert fix(llama, "--create-pr", *args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not standin.matching(contains="/resolve/") and not standin.matching(method="POST")
    assert not standin.matching(contains=f"/api/models/{llama}")  # not even the listing


def test_fine_grained_tokens() -> None:
    def answer(role: str, grants: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"name": "bot", "auth": {"accessToken": {"role": role, "fineGrained": grants}}}

    scoped = {"scoped": [{"entity": {"type": "org", "name": "org"}, "permissions": ["repo.content.read"]},
                         {"entity": {"type": "model", "name": "org/b"}, "permissions": ["discussion.write"]}]}
    assert refusal_of(answer("write"), "org/a") == ""
    assert "read-only" in refusal_of(answer("read"), "org/a")
    assert refusal_of(answer("fineGrained", {"global": ["discussion.write"]}), "org/a") == ""
    assert "fine-grained" in refusal_of(answer("fineGrained", scoped), "org/a")
    assert refusal_of(answer("fineGrained", scoped), "org/b") == ""
    assert refusal_of({"name": "x", "auth": {"type": "oauth"}}, "org/a") == ""  # unknown: the Hub decides


def test_a_fine_grained_token_scoped_elsewhere_is_refused(standin: StandinHub, llama: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    standin.tokens["hf_scoped"] = "scoped-bot"
    standin.token_roles["hf_scoped"] = "fineGrained"
    standin.fine_grained["hf_scoped"] = {"global": [], "scoped": [
        {"entity": {"type": "user", "name": "scoped-bot"}, "permissions": ["repo.write"]}]}
    assert fix(llama, *BF16, "--token", "hf_scoped", "--create-pr") == 2
    assert "without repo.write or discussion.write" in capsys.readouterr().err
    assert not standin.matching(contains="/resolve/")


def test_a_pull_request_revision_is_a_usage_error(standin: StandinHub, llama: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert fix(llama, "--revision", "refs/pr/3", "--token", "hf_bot", "--create-pr") == 2
    assert "not into another pull request" in capsys.readouterr().err
    assert not standin.records


# ---------------------------------------------------------------- hostile names


def test_hostile_tensor_names_are_inert_in_the_pull_request(standin: StandinHub,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    state = {HOSTILE: torch.ones(4, 4, dtype=torch.float16), "w": torch.ones(4, 4, dtype=torch.bfloat16),
             "v": torch.ones(4, 4, dtype=torch.bfloat16)}
    standin.add_repo("org/hostile", {"pytorch_model.bin": pickled(state),
                                     "config.json": b'{"torch_dtype": "float32"}\n'})
    assert fix("org/hostile") == 1
    out = capsys.readouterr().out
    assert "\n# heading" not in out  # the terminal view escapes newlines
    assert fix("org/hostile", "--token", "hf_bot", "--create-pr") in (0, 1)
    [pr] = pull_requests(standin, "org/hostile")
    text = pr.description
    assert "<img" not in text and "\n# heading" not in text and "](http://evil)" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text  # shown, as text
    assert text.count("<details>") == text.count("</details>")
    assert text.count("```") % 2 == 0


# ---------------------------------------------------------------- the reviewer: `hub webhook --fix`


def fixing_reviewer(state: Path) -> Any:
    from guard.config import build_policy
    from guard.hub.client import HubClient
    from guard.hub.reviewer import Reviewer, ReviewSettings

    settings = ReviewSettings(workers=2, lease=10.0, retry_backoff=0.0, poll=0.05, fix=True)
    client = HubClient(token="hf_bot", timeout=10)
    return Reviewer(client, build_policy({}, source=None, overrides={}), open_queue(state), settings=settings)


def review(reviewer: Any, *jobs: Job) -> None:
    reviewer.start()
    try:
        for job in jobs:
            reviewer.submit(job)
        assert reviewer.wait_idle(120)
    finally:
        reviewer.close()


def test_webhook_fix_offers_one_pull_request_and_never_fixes_a_fix(standin: StandinHub, llama: str,
                                                                  tmp_path: Path) -> None:
    from hub_delivery import AppServer, Push

    head = standin.repos[llama].refs["main"]
    service = AppServer(fixing_reviewer(tmp_path / "q.sqlite3"))  # the real app, its lifespan runs the workers
    try:
        assert service.post(Push(llama, "refs/heads/main", head).event()).status_code == 202
        assert service.reviewer.wait_idle(120)
        [pr] = pull_requests(standin, llama)
        [discussion] = [d for d in standin.repos[llama].discussions if not d.is_pr]
        assert "CG103" in discussion.description  # the review is answered as before
        assert pr.author == "ckpt-guard-bot"
        assert {"config.json", "model.safetensors"} <= set(standin.files_at(llama, pr.ref))
        # the pull request's own push (the Hub sends one for the new refs/pr/N): not reviewed, not fixed
        pr_head = standin.repos[llama].refs[pr.ref]
        assert service.post(Push(llama, pr.ref, pr_head).event()).json()["queued"] == 1
        assert service.reviewer.wait_idle(120)
        assert pr.comments == [] and len(pull_requests(standin, llama)) == 1
        assert service.reviewer.stats()["skipped"] == 1
    finally:
        service.stop()
    # the first push redelivered to a reviewer that lost its queue: the Hub's marker answers
    review(fixing_reviewer(tmp_path / "fresh.sqlite3"), Job(llama, "refs/heads/main", head))
    assert len(pull_requests(standin, llama)) == 1
    # merged (fast-forward: main's head is our fix commit): reviewed, never fixed again
    new_head = standin.merge_pull_request(llama, pr.num)
    assert new_head == pr_head
    review(fixing_reviewer(tmp_path / "q.sqlite3"), Job(llama, "refs/heads/main", new_head))
    assert len(pull_requests(standin, llama)) == 1
    [thread] = [d for d in standin.repos[llama].discussions if not d.is_pr]  # one review thread for main:
    assert len(standin.repos[llama].discussions) == 2 and len(thread.comments) == 1  # the merge is a comment in it


def test_the_reviewer_never_fixes_a_commit_carrying_the_marker(standin: StandinHub, tmp_path: Path) -> None:
    # Whatever a fix leaves behind: a failing commit that is a fix of ours is never fixed again
    files = llama_files()
    sha = standin.add_repo("org/again", files)
    sha = standin.add_commit("org/again", files, summary=f"{TITLE_PREFIX}{sha[:12]} with 2 changes [x]",
                             description=f"{MARKER_PREFIX}plan={'0' * 64} base={sha} -->")
    review(fixing_reviewer(tmp_path / "q.sqlite3"), Job("org/again", "refs/heads/main", sha))
    assert not pull_requests(standin, "org/again")
    assert len(standin.repos["org/again"].discussions) == 1  # the review itself still answers


def test_the_reviewer_comments_on_other_peoples_pull_requests_but_does_not_fix_them(
        standin: StandinHub, llama: str, tmp_path: Path) -> None:
    num, sha = standin.add_pull_request(llama, {"config.json": b'{"torch_dtype": "float16"}\n'})
    review(fixing_reviewer(tmp_path / "q.sqlite3"), Job(llama, f"refs/pr/{num}", sha))
    [pr] = pull_requests(standin, llama)
    assert len(pr.comments) == 1 and pr.comments[0][0] == "ckpt-guard-bot"


def test_webhook_fix_flag_reaches_the_reviewer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from guard.hub import service

    seen: dict[str, Any] = {}
    monkeypatch.setattr(service, "drain", lambda **kw: seen.update(kw) or {"failed": 0})
    assert main(["hub", "webhook", "--once", "--fix", "--state", str(tmp_path / "q.sqlite3")]) == 0
    assert seen["settings"].fix


# ---------------------------------------------------------------- the queue keys jobs by endpoint


@pytest.fixture(params=["sqlite", "postgres"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "queue.sqlite3")
    return str(request.getfixturevalue("postgres_url"))


STAGING, PROD = "https://hub-ci.huggingface.co", "https://huggingface.co"


def test_the_same_push_on_two_endpoints_is_two_jobs(state: str) -> None:
    queue = open_queue(state)
    push = ("org/m", "refs/heads/main", "a" * 40)
    assert queue.enqueue([Job(*push, STAGING)]) == [True]
    staged = queue.claim("w", lease=60, max_attempts=3, endpoint=STAGING)
    assert staged is not None and staged.job.endpoint == STAGING and queue.finish(staged.id, "w", "answered")
    assert queue.enqueue([Job(*push, STAGING), Job(*push, PROD)]) == [False, True]  # production still hears it
    assert queue.claim("w", lease=60, max_attempts=3, endpoint=STAGING) is None  # not staging's
    prod = queue.claim("w", lease=60, max_attempts=3, endpoint=PROD)
    assert prod is not None and prod.job == Job(*push, PROD)
    assert [j.to_json()["endpoint"] for j in queue.jobs()] == [STAGING, PROD]
    queue.close()


def test_the_reviewer_keys_its_jobs_by_its_endpoint(standin: StandinHub, tmp_path: Path) -> None:
    reviewer = fixing_reviewer(tmp_path / "q.sqlite3")
    assert reviewer.submit(Job("org/m", "refs/heads/main", "b" * 40))
    [queued] = reviewer.queue.jobs()
    assert queued.job.endpoint == standin.url
    reviewer.queue.close()


OLD_SQLITE = """CREATE TABLE jobs (
        id INTEGER PRIMARY KEY,
        repo TEXT NOT NULL, ref TEXT NOT NULL, sha TEXT NOT NULL,
        state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        enqueued_at REAL NOT NULL, updated_at REAL NOT NULL, next_at REAL NOT NULL,
        lease_until REAL, worker TEXT, error TEXT,
        UNIQUE (repo, ref, sha))"""
OLD_POSTGRES = """CREATE TABLE ckpt_guard_jobs (
        id BIGSERIAL PRIMARY KEY,
        repo TEXT NOT NULL, ref TEXT NOT NULL, sha TEXT NOT NULL,
        state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(), updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        next_at TIMESTAMPTZ NOT NULL DEFAULT now(), lease_until TIMESTAMPTZ, worker TEXT, error TEXT,
        UNIQUE (repo, ref, sha))"""


def make_schema_1(state: str) -> None:
    """A queue as the previous release left it: two done jobs and one queued, keyed by (repo, ref, sha)."""
    rows = [("org/a", "refs/heads/main", "a" * 40, "answered"), ("org/b", "refs/pr/1", "b" * 40, "skipped"),
            ("org/c", "refs/heads/main", "c" * 40, "queued")]
    if "://" not in state:
        with sqlite3.connect(state) as db:
            db.execute(OLD_SQLITE)
            db.execute("CREATE INDEX jobs_due ON jobs (state, next_at)")
            db.executemany("INSERT INTO jobs (repo, ref, sha, state, enqueued_at, updated_at, next_at) "
                           "VALUES (?, ?, ?, ?, 1, 1, 1)", rows)
            db.execute("PRAGMA user_version = 1")
        return
    import psycopg

    with psycopg.connect(state, autocommit=True) as db:
        db.execute(OLD_POSTGRES)
        for row in rows:
            db.execute("INSERT INTO ckpt_guard_jobs (repo, ref, sha, state) VALUES (%s, %s, %s, %s)", row)


def test_an_old_queue_is_migrated_and_its_rows_keep_working(state: str) -> None:
    make_schema_1(state)
    queue = open_queue(state)
    listed = queue.jobs()
    assert [(j.id, j.job.repo_id, j.state, j.job.endpoint) for j in listed] == [
        (1, "org/a", "answered", ""), (2, "org/b", "skipped", ""), (3, "org/c", "queued", "")]
    old = Job("org/a", "refs/heads/main", "a" * 40)
    assert queue.enqueue([old]) == [False]  # an old row still answers for the old key
    assert queue.enqueue([Job(old.repo_id, old.ref, old.sha, PROD)]) == [True]  # but silences no endpoint
    claimed = queue.claim("w", lease=60, max_attempts=3, endpoint=PROD)
    assert claimed is not None and claimed.job.repo_id == "org/c"  # a queued old row: any reviewer takes it
    assert queue.finish(claimed.id, "w", "answered")
    queue.close()
    reopened = open_queue(state)  # migrating twice is a no-op
    assert len(reopened.jobs()) == 4
    reopened.close()


# ---------------------------------------------------------------- huggingface_hub 2.x (httpx2)


@pytest.fixture(scope="module")
def hub2_cli(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ckpt-guard` in a throwaway venv with huggingface_hub 2.4.0 and what a safetensors copy needs."""
    import subprocess
    import venv

    root = tmp_path_factory.mktemp("hub2-fix") / "venv"
    venv.EnvBuilder(with_pip=True).create(root)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    install = subprocess.run([*pip, "huggingface_hub==2.4.0", "click>=8.1", "httpx", "numpy", "ml_dtypes"],
                             capture_output=True, text=True, timeout=600)
    if install.returncode != 0:
        pytest.skip(f"cannot install huggingface_hub 2.4.0 here: {install.stderr.strip()[-300:]}")
    subprocess.run([*pip, "--no-deps", str(Path(__file__).resolve().parents[1])], check=True, capture_output=True,
                   timeout=600)
    return root / "bin" / "ckpt-guard"


@pytest.mark.slow
def test_hub_fix_on_huggingface_hub_2(hub2_cli: Path, tmp_path: Path) -> None:
    import os
    import subprocess

    with StandinHub() as hub:
        hub.add_repo(REPO, llama_files())
        hub.add_repo("org/twice", llama_files())
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "127.0.0.1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": "", "CI": "true"}

        def run(repo: str, *args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(hub2_cli), "hub", "fix", repo, *BF16, *args], capture_output=True, text=True,
                                  env=env, cwd=tmp_path, timeout=300)

        version = subprocess.run([str(hub2_cli.parent / "python"), "-c",
                                  "import huggingface_hub; print(huggingface_hub.__version__)"],
                                 capture_output=True, text=True, env=env, check=True)
        assert version.stdout.strip() == "2.4.0"
        assert run(REPO).returncode == 1
        refused = run(REPO, "--token", "hf_reader", "--create-pr")
        assert refused.returncode == 2 and "read-only token" in refused.stderr and "Traceback" not in refused.stderr
        hub.reset_records()
        opened = run(REPO, "--token", "hf_bot", "--create-pr")
        assert opened.returncode == 0, opened.stderr
        [pr] = pull_requests(hub, REPO)
        assert {"config.json", "model.safetensors"} <= set(hub.files_at(REPO, pr.ref))
        assert downloaded(hub, REPO) == {"config.json", "pytorch_model.bin"}
        assert run(REPO, "--token", "hf_bot", "--create-pr").returncode == 0
        assert len(pull_requests(hub, REPO)) == 1
        hub.fail("POST", "/commit/", 429, headers={"Retry-After": "0"}, after=True)
        assert run("org/twice", "--token", "hf_bot", "--create-pr").returncode == 0
        assert len(pull_requests(hub, "org/twice")) == 1
