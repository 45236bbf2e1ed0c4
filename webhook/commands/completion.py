"""``gpu-admission completion bash|zsh``: shell completion generated from the CLI's own parser tree.

Nothing is written by hand per command: the script is made by walking the argparse parsers
(``tree``), so a new subcommand, flag or ``choices`` list completes as soon as it is declared.
Both scripts share one shape: shell functions that answer, for a command path such as ``certs
rotate``, its subcommands, its flags, which flags take a value and that value's choices; the
completion function walks the words typed so far to find the path. A flag's value without
choices completes as a file name. Flags hidden from help (an old spelling kept as an error that
names the new one, ``flags.add_renamed``) are not offered.

    source <(gpu-admission completion bash)          # ~/.bashrc
    source <(gpu-admission completion zsh)           # ~/.zshrc, after compinit
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

SHELLS = ("bash", "zsh")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Command:
    """One parser of the tree: its path of subcommand names, its subcommands, its flags."""

    path: tuple[str, ...]
    subcommands: tuple[str, ...]
    options: tuple[str, ...]
    words: tuple[str, ...]  # the choices of its positional arguments (`completion bash|zsh`, `explain pod`)
    # flag -> its choices ('' for a value without choices); only the flags that take a value
    values: dict[str, tuple[str, ...]]


def tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[Command]:
    """Every parser under ``parser`` (itself first), depth first."""
    found: list[Command] = []
    subcommands: dict[str, argparse.ArgumentParser] = {}
    options: list[str] = []
    words: list[str] = []
    values: dict[str, tuple[str, ...]] = {}
    for action in parser._actions:  # argparse has no public walk of its actions
        if isinstance(action, argparse._SubParsersAction):
            subcommands.update(action.choices)
            continue
        if action.help == argparse.SUPPRESS:  # hidden: a renamed flag kept only to name its successor
            continue
        options.extend(action.option_strings)
        if not action.option_strings and action.choices is not None:
            words.extend(str(choice) for choice in action.choices)
        if action.option_strings and action.nargs != 0:
            choices = tuple(str(choice) for choice in action.choices) if action.choices is not None else ()
            for option in action.option_strings:
                values[option] = choices
    found.append(Command(path=path, subcommands=tuple(subcommands), options=tuple(options), words=tuple(words), values=values))
    seen: set[int] = set()
    for name, child in subcommands.items():
        if id(child) in seen:  # an alias names the same parser again
            continue
        seen.add(id(child))
        found.extend(tree(child, (*path, name)))
    return found


def _function_name(prog: str) -> str:
    return "_" + "".join(c if c.isalnum() else "_" for c in prog)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _tables(commands: list[Command], *, name: str) -> str:
    """The shell functions both scripts share (POSIX ``case``; bash and zsh read them alike)."""
    lines = [f"{name}_subcommands() {{", '    case "$1" in']
    for command in commands:
        if command.subcommands:
            lines.append(f"        {_quote(' '.join(command.path))}) echo {_quote(' '.join(command.subcommands))} ;;")
    lines += ["    esac", "}", f"{name}_words() {{", '    case "$1" in']
    for command in commands:
        if command.words:
            lines.append(f"        {_quote(' '.join(command.path))}) echo {_quote(' '.join(command.words))} ;;")
    lines += ["    esac", "}", f"{name}_options() {{", '    case "$1" in']
    for command in commands:
        lines.append(f"        {_quote(' '.join(command.path))}) echo {_quote(' '.join(command.options))} ;;")
    lines += [
        "    esac",
        "}",
        "# status 0 when flag $2 of command $1 takes a value; prints its choices",
        f"{name}_value() {{",
        '    case "$1|$2" in',
    ]
    for command in commands:
        by_choices: dict[tuple[str, ...], list[str]] = {}
        for option, choices in command.values.items():
            by_choices.setdefault(choices, []).append(option)
        for choices, options in by_choices.items():
            pattern = "|".join(_quote(" ".join(command.path) + "|" + option) for option in options)
            lines.append(f"        {pattern}) echo {_quote(' '.join(choices))} ;;")
    lines += ["        *) return 1 ;;", "    esac", "}"]
    return "\n".join(lines) + "\n"


def _walk(name: str, *, first: str, last: str) -> str:
    """Shell lines that set ``cmdpath`` from the words ``first`` .. ``last`` - 1 (not ``path``: zsh ties it to $PATH)."""
    return f"""    local cmdpath="" i word subs skip=0
    for ((i = {first}; i < {last}; i++)); do
        word="${{words_[i]}}"
        if [[ $skip -eq 1 ]]; then skip=0; continue; fi
        if [[ "$word" == -* && "$word" != *=* ]] && {name}_value "$cmdpath" "$word" >/dev/null; then skip=1; continue; fi
        subs=" $({name}_subcommands "$cmdpath") "
        if [[ "$subs" == *" $word "* ]]; then cmdpath="${{cmdpath:+$cmdpath }}$word"; fi
    done
"""


def bash(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    name = _function_name(prog)
    return (
        f"# bash completion for {prog}, generated by `{prog} completion bash`\n"
        + _tables(tree(parser), name=name)
        + f"""{name}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" choices
    local -a words_=("${{COMP_WORDS[@]}}")
{_walk(name, first="1", last="COMP_CWORD")}    if [[ $COMP_CWORD -gt 1 && "$prev" == -* ]] && choices="$({name}_value "$cmdpath" "$prev")"; then
        if [[ -n "$choices" ]]; then COMPREPLY=($(compgen -W "$choices" -- "$cur")); else COMPREPLY=($(compgen -f -- "$cur")); fi
        return 0
    fi
    subs="$({name}_subcommands "$cmdpath")"
    [[ -z "$subs" ]] && subs="$({name}_words "$cmdpath")"
    if [[ "$cur" == -* || -z "$subs" ]]; then
        COMPREPLY=($(compgen -W "$({name}_options "$cmdpath")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$subs" -- "$cur"))
    fi
    return 0
}}
complete -o default -F {name} {prog}
"""
    )


def zsh(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    name = _function_name(prog)
    return (
        f"#compdef {prog}\n# zsh completion for {prog}, generated by `{prog} completion zsh`\n"
        + _tables(tree(parser), name=name)
        + f"""{name}() {{
    local cur="${{words[CURRENT]}}" prev="${{words[CURRENT-1]}}" choices
    local -a words_ candidates
    words_=("${{words[@]}}")  # zsh counts from 1: the command is word 1, the first argument word 2
{_walk(name, first="2", last="CURRENT")}    if (( CURRENT > 2 )) && [[ "$prev" == -* ]] && choices="$({name}_value "$cmdpath" "$prev")"; then
        if [[ -n "$choices" ]]; then candidates=(${{=choices}}); compadd -- $candidates; else _files; fi
        return 0
    fi
    subs="$({name}_subcommands "$cmdpath")"
    [[ -z "$subs" ]] && subs="$({name}_words "$cmdpath")"
    if [[ "$cur" == -* || -z "$subs" ]]; then
        candidates=(${{=$({name}_options "$cmdpath")}})
    else
        candidates=(${{=subs}})
    fi
    compadd -- $candidates
}}
if [[ "${{funcstack[1]}}" == "{name}" ]]; then
    {name} "$@"
else
    compdef {name} {prog}
fi
"""
    )


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "completion",
        help="print a bash or zsh completion script",
        description="Print the completion script for SHELL: `source <(gpu-admission completion bash)` in ~/.bashrc, "
        "or `source <(gpu-admission completion zsh)` in ~/.zshrc after compinit.",
    )
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from webhook import cli  # noqa: PLC0415 - the whole CLI, every command's flags, is what gets completed

    parser = cli.make_parser()
    sys.stdout.write(bash(parser) if args.shell == "bash" else zsh(parser))
    return 0
