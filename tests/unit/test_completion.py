"""`gpu-admission completion bash|zsh`: scripts generated from the parser tree, valid, and completing."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from webhook import cli
from webhook.cmdline import flags
from webhook.commands import completion


def _script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["completion", shell]) == 0
    out = capsys.readouterr().out
    assert out
    return out


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers for the last of `words` (the word being typed) after the others."""
    program = (
        script
        + "\nCOMP_WORDS=("
        + " ".join(f"'{w}'" for w in words)
        + f")\nCOMP_CWORD={len(words) - 1}\n"
        + '_gpu_admission\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile"], input=program, capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.split()


def test_the_bash_script_is_valid_bash(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    script = _script("bash", capsys)
    done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "complete -o default -F _gpu_admission gpu-admission" in script


def test_bash_completes_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("bash", capsys)
    assert _complete(script, "gpu-admission", "") == list(cli.SUBCOMMANDS)
    assert _complete(script, "gpu-admission", "ce") == ["certs"]
    assert _complete(script, "gpu-admission", "certs", "r") == ["rotate"]


def test_bash_completes_a_subcommands_flags_and_their_choices(capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("bash", capsys)
    assert set(_complete(script, "gpu-admission", "inspect", "--k")) == {"--kubeconfig"}
    assert _complete(script, "gpu-admission", "inspect", "-o", "") == ["table", "wide", "json", "yaml", "name"]
    assert _complete(script, "gpu-admission", "serve", "--log-format", "j") == ["json"]
    # a flag's value that happens to be a command name is not taken for the command
    assert "--ca" in _complete(script, "gpu-admission", "certs", "rotate", "--kubeconfig", "show", "--c")
    assert _complete(script, "gpu-admission", "completion", "") == ["bash", "zsh"]
    assert _complete(script, "gpu-admission", "completion", "-") == ["-h", "--help"]


def test_every_subcommand_and_flag_of_the_parser_is_in_the_tree() -> None:
    commands = {c.path: c for c in completion.tree(cli.make_parser())}
    assert commands[()].subcommands == tuple(cli.SUBCOMMANDS)
    assert "--context" in commands[("certs", "show")].options
    assert commands[("audit",)].values["-o"] == ("table", "json", "yaml", "markdown", "html")
    assert commands[("audit",)].values["--kubeconfig"] == ()
    assert "--write-reports" not in commands[("audit",)].values  # a switch takes no value


def test_o_completes_formats_and_output_file_a_file_name(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script("bash", capsys)
    assert _complete(script, "gpu-admission", "policies", "export-vap", "-o", "") == ["yaml", "json"]
    assert _complete(script, "gpu-admission", "snapshot", "-o", "") == ["yaml", "json"]
    (tmp_path / "report.html").write_text("")
    monkeypatch.chdir(tmp_path)
    assert _complete(script, "gpu-admission", "audit", "--output-file", "rep") == ["report.html"]
    assert "--output-file" in _complete(script, "gpu-admission", "audit", "--output")


def test_a_renamed_flag_is_not_offered() -> None:
    parser = flags.Parser(prog="gpu-admission")
    sub = parser.add_subparsers(dest="command", required=True).add_parser("thing")
    flags.add_output_file(sub)
    flags.add_renamed(sub, "--old-file", new="--output-file")
    (_, thing) = completion.tree(parser)
    assert "--old-file" not in thing.options and "--old-file" not in thing.values
    assert thing.values["--output-file"] == ()


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_the_zsh_script_is_valid_zsh(capsys: pytest.CaptureFixture[str]) -> None:
    done = subprocess.run(["zsh", "-n"], input=_script("zsh", capsys), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_the_zsh_script_declares_itself_and_shares_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("zsh", capsys)
    assert script.startswith("#compdef gpu-admission\n")
    assert "compdef _gpu_admission gpu-admission" in script
    # the same tables as bash: one source for both shells
    assert completion._tables(completion.tree(cli.make_parser()), name="_gpu_admission") in script  # noqa: SLF001
    # bash reads the shared tables and the zsh walk alike (zsh -n is run where zsh is installed)
    done = subprocess.run(["bash", "-n"], input=script.split("_gpu_admission() {")[0], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_offers_subcommands_choices_and_files(capsys: pytest.CaptureFixture[str]) -> None:
    # compadd and _files stand in for zsh's completion system: they print what they are given
    # (the real compadd then keeps those matching the word typed so far).
    program = (
        _script("zsh", capsys)
        + """
compadd() { shift $(( ${@[(i)--]} )); print -l -- "$@"; }
_files() { print "<files>"; }
words=(gpu-admission ''); CURRENT=2; _gpu_admission; print =
words=(gpu-admission inspect -o ''); CURRENT=4; _gpu_admission; print =
words=(gpu-admission audit --kubeconfig ''); CURRENT=4; _gpu_admission; print =
words=(gpu-admission certs rotate --kubeconfig show -); CURRENT=6; _gpu_admission
"""
    )
    program = program.replace('if [[ "${funcstack[1]}" == "_gpu_admission" ]]; then', "if true; then :; elif false; then")
    done = subprocess.run(["zsh", "-f"], input=program, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    commands, outputs, kubeconfig, rotate = done.stdout.split("=\n")
    assert commands.split() == list(cli.SUBCOMMANDS)
    assert outputs.split() == ["table", "wide", "json", "yaml", "name"]
    assert kubeconfig.split() == ["<files>"]
    assert "--ca" in rotate.split() and "--propagation-delay" in rotate.split()
