"""python -m bench.endpointattachment [--quick] [--help]: the EndpointAttachment benchmark alone."""

from __future__ import annotations

from bench.endpointattachment import run


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table; exit with status 1 when a figure misses its target."""
    status = run(argv)
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
