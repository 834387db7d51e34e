"""Commands over the published-measurement set: ``profiles``, ``check-published``,
``fit-published`` (the work is in ``harness.published``)."""

from __future__ import annotations

import argparse

from harness.cli.common import RawDescriptionFormatter, add_subparser
from harness.published import cli as published


def _sentence(text: str) -> str:
    """A command's one-line help (lower case, as in the command list) as its description."""
    return text[:1].upper() + text[1:] + "."


def add_profiles(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(sub, "profiles", help=published.PROFILES_HELP,
                      description=_sentence(published.PROFILES_HELP),
                      epilog="example: batchlab profiles; then batchlab simulate --profile "
                      "vllm-h100-sxm --trace harness/data/azure_conv_excerpt.csv")
    published.profiles_add_arguments(p)


def cmd_profiles(args: argparse.Namespace) -> int:
    return int(published.profiles_run(args))


def add_check_published(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(sub, "check-published", help=published.CHECK_HELP,
                      formatter_class=RawDescriptionFormatter)
    published.check_add_arguments(p)


def cmd_check_published(args: argparse.Namespace) -> int:
    return int(published.check_run(args))


def add_fit_published(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(sub, "fit-published", help=published.FIT_HELP,
                      description=_sentence(published.FIT_HELP),
                      formatter_class=RawDescriptionFormatter)
    published.fit_add_arguments(p)


def cmd_fit_published(args: argparse.Namespace) -> int:
    return int(published.fit_run(args))
