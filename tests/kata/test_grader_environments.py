"""The grader in the environments a learner really has: TRITON_INTERPRET=1 exported before anything
is cached, a .kata/ that cannot be written (a read-only course folder, a full disk), and a cached
verdict met again on another GPU or other versions."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
from grader_repo import SOLUTION, grader, make_repo

from kata.exercises import EXERCISES, ROOT, find
from kata.gpu import triton_missing
from kata.grader import cache

NOT_KEPT = "note: results are not cached"


def test_an_unwritable_kata_folder_is_said_once_and_changes_no_verdict(tmp_path):
    """.kata/ a plain file, as unwritable as a read-only folder is to a learner (the tests run as
    root, whom no file mode stops): every command runs and exits as usual, the report says once why
    nothing is remembered, and reset refuses rather than lose a file it cannot back up."""
    root = make_repo(tmp_path, real=(), fake={"01": None, "02": SOLUTION, "03": SOLUTION.replace("42", "41")})
    (root / ".kata").write_text("")
    done = grader(root)
    assert done.returncode == 1 and "internal error" not in done.stderr, done.stdout + done.stderr
    assert done.stderr.count(NOT_KEPT) == 1 and "(Not a directory: .kata/" in done.stderr, done.stderr
    assert f"1 of {len(EXERCISES)} exercises passed" in done.stdout, done.stdout
    assert grader(root, "02").returncode == 0 and grader(root, "03").returncode == 1
    machine = grader(root, "--json")  # the note on stderr: the report on stdout stays JSON
    assert json.loads(machine.stdout)["passed"] == 1 and machine.stderr.count(NOT_KEPT) == 1
    hint = grader(root, "hint", "02")
    assert hint.returncode == 0 and "Hint 1 of 2" in hint.stdout and hint.stderr.count(NOT_KEPT) == 1
    learner = root / "exercises" / "03_merge_partials.py"
    before = learner.read_text()
    reset = grader(root, "reset", "03", "--yes")
    assert reset.returncode == 1 and "Not reset: exercises/03_merge_partials.py: its backup could not be" in \
        reset.stdout, reset.stdout + reset.stderr
    assert learner.read_text() == before and "internal error" not in reset.stderr


FULL_DISK = """
import json, resource, signal, sys
from pathlib import Path
from kata.exercises import find
from kata.grader import cache, progress, reset
from kata.grader.results import skipped_result

tmp = Path(sys.argv[1])
cache.CACHE_DIR = tmp / "cache"
reset.BACKUP_DIR = progress.BACKUP_DIR = tmp / "backups"
ex = find("01")
learner = tmp / "exercises" / ex.filename
learner.parent.mkdir()
learner.write_text("# mine\\n" * 2000)
cache.store(skipped_result(ex, learner, "old"), tmp, "old key")
old_entry = sorted(cache.CACHE_DIR.iterdir())
progress_file = progress.Progress(tmp / "progress.json")
progress_file.mark_passed(["01"])

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as one on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
cache.store(skipped_result(ex, learner, "new " * 2000), tmp, "new key")
progress_file.data["hints"] = {str(n): n for n in range(1000)}
progress_file.save()
code = reset.reset([ex], tmp / "exercises", yes=True)
print(json.dumps(dict(
    entries=[p.name for p in sorted(cache.CACHE_DIR.iterdir())], old_entries=[p.name for p in old_entry],
    old_kept=cache.load(ex, tmp, "old key") is not None, progress=json.loads((tmp / "progress.json").read_text()),
    code=code, learner=learner.read_text() == "# mine\\n" * 2000,
    files=sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()))))
"""


def test_a_full_disk_leaves_every_file_under_kata_whole(tmp_path):
    """A write that fails half-way (a file size limit standing for a full disk) leaves the cache entry
    and the progress file as they were, with no half-written file beside them, says so once, and
    refuses a reset whose backup it could not write whole: the learner's file is untouched."""
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["entries"] == seen["old_entries"] and seen["old_kept"], seen
    assert seen["progress"]["hints"] == {} and "01" in seen["progress"]["passed"]
    assert seen["code"] == 1 and seen["learner"]
    assert not [name for name in seen["files"] if name.endswith(".tmp") or name.startswith("backups")], seen
    assert done.stderr.count("note: results are not cached") == 1 and "File too large" in done.stderr, done.stderr
    assert "Not reset: " in done.stdout and "could not be written (File too large" in done.stdout, done.stdout


def test_a_cached_verdict_is_not_met_on_another_gpu_or_versions(monkeypatch):
    """A verdict depends on the GPU (which one, its driver: they decide compiled or interpreted, and
    the skips) and on torch's and Triton's versions: each is in the key."""
    ex, target, read = find("06"), ROOT / "solutions", cache._read

    def key(gpus=("NVIDIA H100 80GB HBM3",), torch="2.11.0+cu128", triton="3.6.0", driver=b"570.86"):
        monkeypatch.setattr(cache, "nvidia_gpus", lambda: list(gpus))
        monkeypatch.setattr(cache, "_read", lambda path: driver if path == cache.DRIVER_VERSION else read(path))
        monkeypatch.setattr(cache, "version", lambda name: {"torch": torch, "triton": triton}.get(name, "1.0"))
        cache._gpu.cache_clear()
        cache._shared.cache_clear()
        return cache.key(ex, target, 300.0, b"the learner's file")

    try:
        same = key()
        assert key() == same
        others = [key(gpus=("NVIDIA H200",)), key(driver=b"535.54"), key(torch="2.13.0+cu128"),
                  key(torch="2.11.0+cpu"), key(triton="3.7.0")]
    finally:
        cache._gpu.cache_clear()
        cache._shared.cache_clear()
    assert same not in others and len(set(others)) == len(others)


COLD_COMPILE = """
import sys
from pathlib import Path
sys.path.insert(0, "tests")
import gpu_compile
gpu_compile.CACHE = Path(sys.argv[1])  # cold, and the checkout's own cache left alone
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""


def test_the_reference_compiles_with_triton_interpret_exported_and_nothing_cached(tmp_path):
    """Triton's tutorials tell learners to export TRITON_INTERPRET=1. With it set before the tests
    start and a cold compile cache, the compile check's own process loaded Triton interpreted and
    failed every kernel ('InterpretedFunction' object has no attribute 'get_capture_scope'), and
    cached that verdict."""
    pytest.importorskip("torch")
    if missing := triton_missing():
        pytest.skip(missing)
    test_file = find("06").test_file
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", COLD_COMPILE, str(tmp_path), str(test_file), "--solutions", "-q",
                           "-p", "no:cacheprovider", "-k", "compiles_for_ampere_and_hopper"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, textwrap.shorten(done.stdout[-3000:], 3000)
    verdicts = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert verdicts and not any(verdicts), verdicts  # compiled, and every verdict cached a pass



@pytest.mark.parametrize("name", ["TRITON_F32_DEFAULT", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE",
                                  "TRITON_INTERPRET"])
def test_a_variable_that_changes_how_kernels_multiply_is_in_the_keys(monkeypatch, name):
    """TF32 asked of Triton's tl.dot or of torch's matmuls from the shell changes float32 verdicts: a
    result cached without it must not answer a run with it. The compile check's key holds the TRITON_
    variables its compiling process inherits, all but TRITON_INTERPRET, which that process drops."""
    ex, target = find("06"), ROOT / "solutions"
    monkeypatch.delenv(name, raising=False)
    before = cache.key(ex, target, 300.0, b"the learner's file")
    monkeypatch.setenv(name, "tf32" if name == "TRITON_F32_DEFAULT" else "1")
    assert cache.key(ex, target, 300.0, b"the learner's file") != before
    if name.startswith("TRITON_") and not triton_missing():
        monkeypatch.syspath_prepend(str(ROOT / "tests"))
        import gpu_compile
        with_it = gpu_compile._given_digest()
        monkeypatch.delenv(name)
        assert (gpu_compile._given_digest() == with_it) == (name == "TRITON_INTERPRET")
