"""CEL libraries for Python measured side by side: correctness, compile time, evaluation time, runaway.

Candidates (each is skipped with a note when it is not installed):

- ``cel-expr-python`` (import ``cel_expr_python``): Google's binding of the C++ CEL runtime (cel-cpp),
  with the type checker and the ``strings``/``optional``/``bindings``/``math`` extensions.
- ``common-expression-language`` (import ``cel``): PyO3 binding of a Rust CEL interpreter.
- ``cel-python`` (import ``celpy``): pure-Python CEL interpreter on lark.

What is measured:

1. Correctness on Kubernetes-CEL-style cases (what ValidatingAdmissionPolicy authors write):
   ``has()``, optional fields ``.?``/``orValue``, the macros all/exists/exists_one/filter/map,
   string functions (``startsWith``, ``matches``, ``lowerAscii``, ``split``), int/uint/double
   arithmetic and overflow, durations and timestamps, ``size()``, ``in`` on maps and lists, and
   an error (not ``false``) on a missing field or key. Expected values follow cel-go, which is what
   the apiserver runs.
2. Compile time: parse (and check, where the library checks) six policy-sized expressions.
3. Evaluation time: those expressions against a 3-container GPU pod, input conversion included
   (that is what a webhook pays per request).
4. Runaway: three nested comprehensions over a 300-element list (27 million iterations) in a
   child process with a wall-clock limit: does the library stop it (a budget) or run on?

Run (the candidates that are not project dependencies are installed by hand)::

    .venv/bin/pip install cel-python common-expression-language
    .venv/bin/python bench/cel_candidates.py
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

ERROR = object()  # expected: an evaluation error
COMPILE_ERROR = object()  # expected: refused at compile time (cel-go's checker refuses it)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    expression: str
    expected: Any


POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "train-0",
        "namespace": "team-a",
        "labels": {"app": "train", "tier": "gpu"},
        "annotations": {"gpu-admission.io/gpu-model": "Tesla-V100-SXM2-32GB"},
    },
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/train:1.2",
                "env": [{"name": "EPOCHS", "value": "10"}],
                "resources": {"limits": {"aliyun.com/gpu-mem": "8", "cpu": "2"}},
            },
            {"name": "sidecar", "image": "registry.example/log:3", "resources": {"limits": {"cpu": "100m"}}},
            {
                "name": "exporter",
                "image": "registry.example/exporter:1",
                "securityContext": {"privileged": False},
            },
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
    },
}

CASES: tuple[Case, ...] = (
    Case("has() on a present field", "has(object.metadata.labels)", True),
    Case("has() on an absent field", "has(object.spec.nodeSelector)", False),
    Case("missing field is an error", "object.spec.nodeSelector == {}", ERROR),
    Case("missing map key is an error", "object.metadata.labels['absent'] == 'x'", ERROR),
    Case("optional field with orValue", "object.spec.?nodeSelector.orValue({}).size() == 0", True),
    Case("optional chain present", "object.metadata.?labels.?app.orValue('none') == 'train'", True),
    Case("all()", "object.spec.containers.all(c, c.image.startsWith('registry.example/'))", True),
    Case("exists()", "object.spec.containers.exists(c, has(c.securityContext))", True),
    Case("exists_one()", "object.spec.containers.exists_one(c, c.name == 'main')", True),
    Case("filter() + size()", "object.spec.containers.filter(c, has(c.resources)).size() == 2", True),
    Case("map()", "object.spec.containers.map(c, c.name) == ['main', 'sidecar', 'exporter']", True),
    Case(
        "nested macro over a map",
        "object.spec.containers.exists(c, has(c.resources) && has(c.resources.limits) && "
        "c.resources.limits.exists(k, k.startsWith('aliyun.com/')))",
        True,
    ),
    Case("in on map keys", "'app' in object.metadata.labels", True),
    Case("in on a list", "'b' in ['a', 'b']", True),
    Case("string matches (RE2)", "object.metadata.name.matches('^train-[0-9]+$')", True),
    Case("string contains/endsWith", "'Tesla-V100'.contains('V100') && 'x.yaml'.endsWith('.yaml')", True),
    Case("strings ext lowerAscii", "'Tesla-V100'.lowerAscii() == 'tesla-v100'", True),
    Case("strings ext split", "'a,b,c'.split(',').size() == 3", True),
    Case("size() of string in code points", "size('héllo') == 5", True),
    Case("int parse of a quantity string", "int(object.spec.containers[0].resources.limits['aliyun.com/gpu-mem']) == 8", True),
    Case("int division truncates", "7 / 2 == 3", True),
    Case("uint arithmetic", "1u + 2u == 3u", True),
    Case("double arithmetic", "1.5 * 2.0 == 3.0", True),
    Case("int overflow is an error", "9223372036854775807 + 1 > 0", ERROR),
    Case("division by zero is an error", "1 / 0 == 0", ERROR),
    Case("int == double is refused by the checker", "1 == 1.0", COMPILE_ERROR),
    Case("duration compare", "duration('1h') > duration('59m30s')", True),
    Case(
        "timestamp + duration",
        "timestamp('2026-01-01T00:00:00Z') + duration('24h') == timestamp('2026-01-02T00:00:00Z')",
        True,
    ),
    Case("error absorbed by ||", "true || object.spec.absent == 1", True),
    Case("ternary", "size(object.spec.containers) > 2 ? 'many' : 'few'", "many"),
    Case("undeclared variable refused", "nosuchvar == 1", COMPILE_ERROR),
)

# Policy-sized expressions, as the examples and the exported built-ins use them.
WORKLOAD: tuple[str, ...] = (
    "object.spec.containers.all(c, !has(c.securityContext) || !has(c.securityContext.privileged) "
    "|| !c.securityContext.privileged)",
    "object.spec.containers.all(c, !has(c.env) || c.env.all(e, e.name != 'NVIDIA_VISIBLE_DEVICES' "
    "|| (has(e.value) && e.value.lowerAscii() in ['void', 'none'])))",
    "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath) || !v.hostPath.path.startsWith('/dev'))",
    "object.spec.containers.all(c, !has(c.resources) || !has(c.resources.limits) || "
    "!('aliyun.com/gpu-mem' in c.resources.limits) || int(c.resources.limits['aliyun.com/gpu-mem']) <= 16)",
    "has(object.metadata.annotations) && 'gpu-admission.io/gpu-model' in object.metadata.annotations",
    "object.metadata.namespace.startsWith('team-') && object.metadata.labels.exists(k, k == 'tier')",
)

RUNAWAY = "object.xs.all(a, object.xs.all(b, object.xs.all(c, a + b + c >= 0)))"
RUNAWAY_SIZE = 300
RUNAWAY_LIMIT_S = 20.0


class Failed(Exception):
    """An evaluation error, or a compile error, reported by a candidate."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    name: str
    module: str
    compile: Callable[[str], Any]  # raises Failed at compile time
    evaluate: Callable[[Any, dict[str, Any]], Any]  # raises Failed on an evaluation error


def _cel_expr_python() -> Candidate:
    from cel_expr_python import cel  # type: ignore[import-untyped]  # ships no type information
    from cel_expr_python.ext import ext_bindings, ext_math, ext_optional, ext_strings  # type: ignore[import-untyped]

    env = cel.NewEnv(
        variables={"object": cel.Type.DYN},
        extensions=[
            ext_strings.ExtStrings(),
            ext_optional.ExtOptional(),
            ext_bindings.ExtBindings(),
            ext_math.ExtMath(),
        ],
    )

    def compile_(expression: str) -> Any:
        try:
            return env.compile(expression)
        except RuntimeError as error:
            raise Failed(str(error)) from error

    def evaluate(program: Any, variables: dict[str, Any]) -> Any:
        try:
            value = program.eval(data=variables)
        except RuntimeError as error:
            raise Failed(str(error)) from error
        if value.type() == cel.Type.ERROR:
            raise Failed(str(value.value()))
        return value.plain_value()

    return Candidate("cel-expr-python", "cel_expr_python", compile_, evaluate)


def _common_expression_language() -> Candidate:
    import cel

    def compile_(expression: str) -> Any:
        try:
            return cel.compile(expression)
        except (ValueError, RuntimeError) as error:
            raise Failed(str(error)) from error

    def evaluate(program: Any, variables: dict[str, Any]) -> Any:
        try:
            return program.execute(variables)
        except Exception as error:  # noqa: BLE001 - the binding raises KeyError, RuntimeError, OverflowError, ...
            raise Failed(f"{type(error).__name__}: {error}") from error

    return Candidate("common-expression-language", "cel", compile_, evaluate)


def _cel_python() -> Candidate:
    import celpy

    env = celpy.Environment()

    def compile_(expression: str) -> Any:
        try:
            return env.program(env.compile(expression))
        except Exception as error:  # noqa: BLE001 - parse errors are several classes
            raise Failed(f"{type(error).__name__}: {error}") from error

    def evaluate(program: Any, variables: dict[str, Any]) -> Any:
        try:
            result = program.evaluate({k: celpy.json_to_cel(v) for k, v in variables.items()})
        except Exception as error:  # noqa: BLE001 - CELEvalError, and plain Python errors leak through
            raise Failed(f"{type(error).__name__}: {str(error)[:200]}") from error
        if isinstance(result, celpy.CELEvalError):
            raise Failed(str(result)[:200])
        return result

    return Candidate("cel-python", "celpy", compile_, evaluate)


FACTORIES: dict[str, Callable[[], Candidate]] = {
    "cel-expr-python": _cel_expr_python,
    "common-expression-language": _common_expression_language,
    "cel-python": _cel_python,
}
MODULES = {"cel-expr-python": "cel_expr_python", "common-expression-language": "cel", "cel-python": "celpy"}


def _same(got: Any, expected: Any) -> bool:
    if isinstance(expected, bool):
        return isinstance(got, bool) or type(got).__name__ == "BoolType" and bool(got) is expected
    return bool(got == expected)


def correctness(candidate: Candidate) -> list[tuple[str, str]]:
    """(case name, "ok" or what happened instead) for every case."""
    rows = []
    for case in CASES:
        try:
            program = candidate.compile(case.expression)
        except Failed as error:
            verdict = "ok" if case.expected is COMPILE_ERROR else f"compile error: {_short(error)}"
            rows.append((case.name, verdict))
            continue
        try:
            got = candidate.evaluate(program, {"object": POD})
        except Failed as error:
            if case.expected is ERROR or case.expected is COMPILE_ERROR:
                verdict = "ok" if case.expected is ERROR else "error at run time (accepted, not refused)"
            else:
                verdict = f"error: {_short(error)}"
            rows.append((case.name, verdict))
            continue
        if case.expected is ERROR:
            rows.append((case.name, f"no error, got {got!r}"))
        elif case.expected is COMPILE_ERROR:
            rows.append((case.name, f"compiled, evaluated to {got!r}"))
        else:
            rows.append((case.name, "ok" if _same(got, case.expected) and got == case.expected else f"got {got!r}"))
    return rows


def _short(error: BaseException) -> str:
    return " ".join(str(error).split())[:90]


def timings(candidate: Candidate, *, rounds: int) -> tuple[float, float]:
    """Median microseconds to compile one workload expression, and to evaluate one against POD."""
    compile_times: list[float] = []
    eval_times: list[float] = []
    programs = [candidate.compile(expression) for expression in WORKLOAD]
    for _ in range(rounds):
        for expression in WORKLOAD:
            started = time.perf_counter()
            candidate.compile(expression)
            compile_times.append(time.perf_counter() - started)
    for program in programs:
        candidate.evaluate(program, {"object": POD})  # warm
    for _ in range(rounds * 10):
        for program in programs:
            started = time.perf_counter()
            candidate.evaluate(program, {"object": POD})
            eval_times.append(time.perf_counter() - started)
    return statistics.median(compile_times) * 1e6, statistics.median(eval_times) * 1e6


def _runaway_child(name: str, queue: Any) -> None:
    candidate = FACTORIES[name]()
    program = candidate.compile(RUNAWAY)
    started = time.perf_counter()
    try:
        candidate.evaluate(program, {"object": {"xs": list(range(RUNAWAY_SIZE))}})
        outcome = "finished"
    except Failed as error:
        outcome = f"stopped: {_short(error)}"
    queue.put((outcome, time.perf_counter() - started))


def runaway(name: str) -> str:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_runaway_child, args=(name, queue))
    child.start()
    child.join(RUNAWAY_LIMIT_S)
    if child.is_alive():
        child.kill()
        child.join()
        return f"still running after {RUNAWAY_LIMIT_S:.0f} s (killed)"
    if queue.empty():
        return f"child exited {child.exitcode}"
    outcome, seconds = queue.get()
    return f"{outcome} after {seconds * 1000:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50, help="timing rounds (default 50)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
        "candidates": {},
    }
    for name, factory in FACTORIES.items():
        if importlib.util.find_spec(MODULES[name]) is None:
            results["candidates"][name] = {"skipped": "not installed"}
            continue
        started = time.perf_counter()
        candidate = factory()
        setup_ms = (time.perf_counter() - started) * 1000
        rows = correctness(candidate)
        compile_us, eval_us = timings(candidate, rounds=args.rounds)
        results["candidates"][name] = {
            "import_and_setup_ms": round(setup_ms, 1),
            "correct": sum(1 for _, verdict in rows if verdict == "ok"),
            "cases": len(rows),
            "failures": {case: verdict for case, verdict in rows if verdict != "ok"},
            "compile_us_median": round(compile_us, 1),
            "eval_us_median": round(eval_us, 1),
            "runaway": runaway(name),
        }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(_markdown(results))
    adopted, *others = list(results["candidates"].items())
    measured = [(name, found) for name, found in others if "skipped" not in found]
    if not measured:
        print(
            "# no record: no other candidate is installed to compare with "
            "(.venv/bin/pip install cel-python common-expression-language)",
            file=sys.stderr,
        )
        return 1
    records.write(
        bench="cel_candidates",
        inputs=vars(args),
        figures=adopted[1],
        reference={"name": measured[0][0], "figures": measured[0][1]},
        headline=records.Headline(
            figure="eval_us_median", label=f"CEL evaluation, {adopted[0]} (adopted)", unit="µs", better="lower"
        ),
    )
    return 0


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        f"{results['when']}, Python {results['python']}, {results['cpus']} CPUs, load {results['load']:.1f}",
        "",
        "| candidate | import+setup ms | correct | compile µs (median) | eval µs (median) | runaway |",
        "|---|---:|---:|---:|---:|---|",
    ]
    failures: list[str] = []
    for name, row in results["candidates"].items():
        if "skipped" in row:
            lines.append(f"| {name} | skipped: {row['skipped']} | | | | |")
            continue
        lines.append(
            f"| {name} | {row['import_and_setup_ms']} | {row['correct']}/{row['cases']} | "
            f"{row['compile_us_median']} | {row['eval_us_median']} | {row['runaway']} |"
        )
        failures.extend(f"- {name}: {case}: {verdict}" for case, verdict in row["failures"].items())
    if failures:
        lines += ["", "Cases that differ from cel-go:", "", *failures]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
