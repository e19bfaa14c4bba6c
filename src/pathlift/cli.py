"""The ``pathlift`` command: parses arguments, calls the library, prints. Nothing else."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Path-lifting analysis of ReLU networks.")
console = Console()


@app.command()
def norm(
    model: str = typer.Argument(..., help="reference architecture name or checkpoint file"),
    input_shape: list[int] = typer.Option(None, "--input-shape", help="input shape, no batch"),
    q: list[float] = typer.Option([1.0, 2.0, 4.0], "-q", help="exponents q (repeatable)"),
    r: float = typer.Option(1.0, "-r", help="outer exponent r (use inf for max)"),
) -> None:
    """Mixed path-norms ||Phi||_{q,r} in one forward pass per q (thesis Thm 3.1.1)."""
    from pathlift.lift import path_norms
    from pathlift.models import load_model

    net, shape = load_model(model, input_shape)
    table = Table(title=f"path-norms of {model}, input {tuple(shape)}, r={r:g}")
    table.add_column("q", justify="right")
    table.add_column("value", justify="right")
    table.add_column("log10", justify="right")
    for qq, result in path_norms(net, shape, q, r).items():
        table.add_row(f"{qq:g}", f"{result.value:.6g}", f"{result.log10:.6f}")
    console.print(table)


if __name__ == "__main__":
    app()
