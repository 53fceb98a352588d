"""What the docs' prose says about a feature, checked against the code where a test can check it
(issue 31 item 4): the defaults and constants the pages quote, the modes and backends they list, the
extras they install, the ``fitInfo`` keys and pages they name, the shipped configs they describe, and
backend ``auto``'s choice (and its console line) on ``local[2]``.

Each check reads the page's sentence as written (runs of spaces and line breaks read as one space), so a page that changes the
sentence or a code change that makes it false fails here, naming both.
"""

import configparser
import glob
import os
import re

import pytest
import yaml

from tests.docs.snippets import ROOT, pages


def text(page: str) -> str:
    """``page`` with every run of spaces and line breaks folded into one space."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return re.sub(r"\s+", " ", f.read())


def says(page: str, sentence: str) -> bool:
    return re.sub(r"\s+", " ", sentence) in text(page)


# ---- defaults and constants ---------------------------------------------------------------------


def test_the_asynchronous_modes_defaults_are_the_quoted_ones():
    from sparkdl.config import ASYNC_DEFAULT_LOCAL_STEPS, DEFAULT_STALENESS
    from sparkdl.core.modes import ASYNC_MODES
    from sparkdl.param_specs import PARAMS

    page = "docs/user-guide/training-modes.md"
    assert says(page, "default τ = 4, s = 2") and says(page, "τ = each mode's default, 4")
    assert {mode: ASYNC_DEFAULT_LOCAL_STEPS[mode] for mode in ASYNC_MODES} == dict.fromkeys(ASYNC_MODES, 4)
    assert DEFAULT_STALENESS == 2 and {p.name: p.default for p in PARAMS}["staleness"] == 2


def test_bmuf_and_easgd_defaults_are_the_quoted_ones():
    from sparkdl import KerasEstimator
    from sparkdl.param_specs import PARAMS

    page = "docs/user-guide/training-modes.md"
    assert says(page, "`blockMomentum` η (default 1 − 1/numWorkers), `blockLearningRate` ζ (1), `nesterov` (True)")
    assert says(page, "`elasticForce` α (default 0.9/numWorkers)")
    defaults = {p.name: p.default for p in PARAMS}
    assert defaults["blockMomentum"] is None and defaults["blockLearningRate"] == 1.0 and defaults["nesterov"] is True
    from sparkdl.core.modes import build_policy, policy_class

    estimator = KerasEstimator()

    def built(mode, workers):  # as a fit builds it: the mode's Params at the estimator's defaults
        params = {name: estimator.getOrDefault(name) for name in policy_class(mode).PARAMS}
        return build_policy(mode, params, trainable=[True], workers=workers)

    assert built("bmuf", 4).eta == pytest.approx(0.75)  # 1 - 1/4
    assert built("easgd", 3).alpha == pytest.approx(0.3)  # 0.9/3


def test_heartbeats_are_a_tenth_of_worker_timeout_at_most_two_seconds():
    from sparkdl.config import FitConfig

    for page in ("docs/user-guide/training-modes.md", "docs/user-guide/failures.md"):
        assert says(page, "every tenth of `workerTimeout` (at most every 2 s)"), page
    assert FitConfig(worker_timeout_s=600.0).heartbeat_s == 2.0
    assert FitConfig(worker_timeout_s=10.0).heartbeat_s == pytest.approx(1.0)


def test_the_quoted_limits_of_ps_connect_pieces_and_snapshots():
    import inspect

    from sparkdl.core.pieces import DEFAULT_PIECE_BYTES
    from sparkdl.spark.session import DEFAULT_CONNECT_MESSAGE_BYTES, INLINE_RESERVE_BYTES
    from sparkdl.spark.training.checkpoint import FitStateStore
    from sparkdl.spark.cluster import SLOT_WAIT_S

    assert says("docs/user-guide/failures.md", "A `ps` fit on a cluster waits up to 60 s for executors still registering")
    assert SLOT_WAIT_S == 60.0
    assert says("docs/user-guide/failures.md", "keeping the last two")
    assert inspect.signature(FitStateStore).parameters["keep"].default == 2
    assert says("docs/user-guide/spark-connect.md", "`grpc.max_send_message_length`; both 128 MiB by default) less 4 MiB")
    assert DEFAULT_CONNECT_MESSAGE_BYTES == 128 * 2**20 and INLINE_RESERVE_BYTES == 4 * 2**20
    assert says("docs/architecture/how-a-fit-runs.md", "cut into pieces of at most 16 MiB")
    assert DEFAULT_PIECE_BYTES == 16 * 2**20


def test_a_cancelled_fit_is_described_as_the_code_raises_it():
    from sparkdl.errors import FitCancelledError, WorkerError
    from sparkdl.spark.jobs import CANCEL_WAIT_S

    page = "docs/user-guide/failures.md"
    assert says(page, "waits up to 30 s for them to end") and CANCEL_WAIT_S == 30.0
    assert says(page, "a subclass of `KeyboardInterrupt` (and of `WorkerError`)")
    assert issubclass(FitCancelledError, KeyboardInterrupt) and issubclass(FitCancelledError, WorkerError)
    assert says(page, '"its Spark jobs were cancelled and none is left running; the SparkSession is usable and the estimator unchanged"')
    assert says(page, "exits with status 1, not 130")


def test_the_quoted_param_defaults_are_the_declared_ones():
    from sparkdl.param_specs import MIXED_PRECISION
    from sparkdl.param_specs import PARAMS

    defaults = {p.name: p.default for p in PARAMS}
    assert says("docs/user-guide/data.md", 'handleInvalid="skip") # drop rows with null/NaN/inf (counted); default "error"')
    assert defaults["handleInvalid"] == "error"
    assert says("docs/gpu.md", '`KerasEstimator(..., mixedPrecision="mixed_bfloat16")` (or `"mixed_float16"`; default `None`')
    assert defaults["mixedPrecision"] is None and set(MIXED_PRECISION) == {"mixed_bfloat16", "mixed_float16"}
    assert says("docs/user-guide/text-models.md", "padded after its ids with `padValue` (default 0")
    assert defaults["padValue"] == 0.0
    assert says("docs/user-guide/training-modes.md", "Start with the default: mode `sync` (model averaging every τ = `localSteps` local steps) on backend `auto`")
    assert defaults["mode"] == "sync" and defaults["backend"] == "auto"


# ---- lists: modes, backends, extras, pages, examples, fitInfo keys ------------------------------


def test_the_modes_the_pages_list_are_the_codes():
    from sparkdl.param_specs import BACKENDS
    from sparkdl.core.modes import ASYNC_MODES, MODES, ROUND_MODES

    page = "docs/user-guide/backend-auto.md"
    assert says(page, "**Asynchronous modes** (`async`, `hogwild`, `staleness_aware`, `ssp`)")
    assert ASYNC_MODES == ("async", "hogwild", "staleness_aware", "ssp")
    assert says(page, "**Round modes** (`sync`, `bmuf`, `easgd`, `gossip`)") and says(page, "**`diloco`**")
    assert set(ROUND_MODES) == {"sync", "bmuf", "easgd", "gossip", "diloco"}
    table = re.findall(r"^\| `(\w+)` \| `(\w+)`(?:, `(\w+)`)? \|", open(os.path.join(ROOT, "docs/user-guide/training-modes.md")).read(), re.M)
    listed = {mode for mode, *_ in table if mode in MODES}
    assert listed == set(MODES)
    assert {b for _, *backends in table for b in backends if b} <= set(BACKENDS)


def test_every_extra_a_page_installs_exists_and_none_is_installed_from_pypi():
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    extras = set(parser["options.extras_require"])
    assert says("README.md", "# extras: gpu, jax, torch, connect, mlflow, tensorboard, plot, test, docs")
    assert extras == {"cpu", "gpu", "jax", "torch", "connect", "mlflow", "tensorboard", "plot", "docs", "test"}
    named, from_pypi = set(), []
    for page in pages():
        body = text(page)
        for group in re.findall(r"(?:-e '\.|\.whl)\[([\w,]+)\]'", body):
            named |= set(group.split(","))
        for match in re.finditer(r"pip install 'sparkdl-keras\[", body):
            sentence = body[max(0, match.start() - 300) : match.end() + 200]
            if not re.search(r"fails|does \*\*not\*\* work", sentence):
                from_pypi.append(f"{page}: {body[match.start():match.end() + 20]}")
    assert named and named <= extras, named - extras
    assert from_pypi == []  # sparkdl-keras is not on PyPI: pages install extras from the clone or a wheel


def test_the_user_guide_overview_links_every_page_of_the_user_guide():
    overview = open(os.path.join(ROOT, "docs/user-guide/index.md")).read()
    guide = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "docs/user-guide/*.md"))} - {"index.md"}
    linked = set(re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]+)?\)", overview))
    assert guide and guide <= linked, guide - linked
    assert "Being written" not in overview


def test_the_examples_page_lists_every_example():
    listed = set(re.findall(r"^\| `(\w+)\.py` \|", open(os.path.join(ROOT, "docs/how-to/examples.md")).read(), re.M))
    files = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "examples", "*.py"))} - {"png_decoder"}
    assert listed == files


def test_every_fitinfo_key_a_page_names_is_one_the_code_writes():
    code = "\n".join(open(p, encoding="utf-8").read() for p in glob.glob(os.path.join(ROOT, "sparkdl", "**", "*.py"), recursive=True))
    keys = {key for page in pages() for key in re.findall(r"fitInfo\[[\"'](\w+)[\"']\]", text(page))}
    assert len(keys) >= 15
    missing = sorted(k for k in keys if not re.search(rf"[\"']{k}[\"']", code))
    assert missing == []


def test_the_shipped_configs_are_what_the_pages_say():
    def fit(name):
        with open(os.path.join(ROOT, "conf", name)) as f:
            return yaml.safe_load(f)["fit"]

    assert says("conf/README.md", "| `mnist_cnn.yaml` | the main job (`make train`): a small CNN on the bundled digits, 8 epochs, mode `sync`")
    assert says("README.md", "with 2 workers, averaging every 16 local steps")
    main = fit("mnist_cnn.yaml")
    assert (main["epochs"], main["mode"], main["num_workers"], main["local_steps"]) == (8, "sync", 2, 16)
    assert main["optimizer"]["config"]["learning_rate"] == 0.002
    assert says("conf/README.md", "| `mnist_quick.yaml` | a quick check of an install or a cluster: an MLP, 1 epoch")
    assert fit("mnist_quick.yaml")["epochs"] == 1
    assert says("conf/README.md", "(`bmuf`, `easgd`, `gossip`, `async`, `hogwild`, `ssp`, `staleness_aware`)")
    for mode in ("bmuf", "easgd", "gossip", "async", "hogwild", "ssp", "staleness_aware"):
        assert fit(f"mnist_cnn_{mode}.yaml")["mode"] == mode
    assert says("docs/user-guide/training-modes.md", "batch 64, Adam 0.001 (half of `sync`'s 0.002")
    for mode in ("async", "hogwild", "ssp", "staleness_aware"):
        config = fit(f"mnist_cnn_{mode}.yaml")
        assert config["optimizer"]["config"]["learning_rate"] == 0.001 and config["batch_size"] == 64, mode


# ---- backend auto, on a real session -------------------------------------------------------------


def test_auto_picks_ps_on_local_2_with_the_line_the_pages_quote(spark):
    from sparkdl.config import FitConfig
    from sparkdl.spark.session import FitPlan
    from sparkdl.spark.backends import choose_backend

    choice = choose_backend(FitPlan.read(spark).cluster, FitConfig(num_workers=2))
    assert (choice.backend, choice.reason) == ("ps", "auto: static allocation, 2 task slots for 2 workers and a driver the executors reach")
    line = f"backend {choice.backend} ({choice.reason})"
    for page in ("README.md", "docs/getting-started.md"):
        assert re.search(rf"sparkdl fit [0-9a-f]{{8}}: {re.escape(line)}", text(page)), page
    assert says("docs/user-guide/backend-auto.md", f"sparkdl fit 1a2b3c4d: {line}")
    assert choose_backend(FitPlan.read(spark).cluster, FitConfig(num_workers=3)).backend == "rounds"  # a slot per worker, or rounds
    assert says("docs/user-guide/backend-auto.md", "The cluster has a task slot per worker right now.")


def test_the_readme_stays_short_with_its_two_commands():
    """The README is at most 200 lines (issue 44 item 9: the detail lives in docs/), and its set-up block
    is exactly the two commands."""
    from tests.docs.snippets import fenced_blocks

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 200
    setup = [b for b in fenced_blocks("README.md") if b.code.startswith("make ")]
    assert len(setup) == 1
    assert [line.split()[:2] for line in setup[0].code.splitlines()] == [["make", "train"], ["make", "test"]]
