"""`admin`: users and their tokens, team quotas and budgets, the audit trail; and `usage`."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from gpufleet.cli.app import COMMAND, app, group, out, print_json
from gpufleet.cli.connect import client
from gpufleet.cli.options import Json
from gpufleet.errors import SpecError

admin = group("Users, team quotas and budgets, the audit trail (admins).")
user_group = group("Users and their tokens.")
quota_group = group("A team's GPU quotas: devices of a type at once.")
budget_group = group("A team's monthly budget in dollars.")
admin.add_typer(user_group, name="user")
admin.add_typer(quota_group, name="quota")
admin.add_typer(budget_group, name="budget")
app.add_typer(admin, name="admin")


@user_group.command("add", cls=COMMAND)
def user_add(
    name: Annotated[str, typer.Argument(help="User name.")],
    team: Annotated[str | None, typer.Option("--team", help="Their team (made if new).")] = None,
    is_admin: Annotated[bool, typer.Option("--admin", help="May act on everyone's jobs.")] = False,
) -> None:
    """Add a user and print their token (shown once; kept only as a hash)."""
    token = client().add_user(name, team, is_admin)
    typer.echo(token)
    typer.echo(f"user {name} added{f' to team {team}' if team else ''}; give them the token "
               "above (they run gpufleet login URL --token-file FILE)", err=True)


@user_group.command("list", cls=COMMAND)
def user_list(as_json: Json = False) -> None:
    """Users, their teams and who is an admin."""
    rows = client().users()
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("No users yet (gpufleet admin user add NAME --team TEAM).", highlight=False)
        return
    out.print(_table(("USER", "TEAM", "ADMIN", "ADDED"), [
        (r["name"], r["team"] or "-", "admin" if r["admin"] else "-", _when(r["created_at"]))
        for r in rows]))


@user_group.command("remove", cls=COMMAND)
def user_remove(name: Annotated[str, typer.Argument(help="User name.")]) -> None:
    """Remove a user: their token stops working; their jobs and usage stay."""
    client().remove_user(name)
    out.print(f"user {name} removed")


def _devices(value: str) -> int | None:
    if value == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise SpecError([("devices", f"'{value}' is not a number of devices; use 0 or more, "
                          "or 'none' to remove the quota")]) from None


NUMBERS = {"ignore_unknown_options": True}  # "-1" is a (refused) number here, not an option


@quota_group.command("set", cls=COMMAND, context_settings=NUMBERS)
def quota_set(
    team: Annotated[str, typer.Argument(help="Team.")],
    gpu: Annotated[str, typer.Argument(help="GPU type, e.g. H100 or cpu.")],
    devices: Annotated[str, typer.Argument(help="At most this many at once ('none': no cap).")],
) -> None:
    """At most N devices of a GPU type held by the team's jobs at once."""
    n = _devices(devices)
    _show_team(client().set_quota(team, gpu, n))


@budget_group.command("set", cls=COMMAND, context_settings=NUMBERS)
def budget_set(
    team: Annotated[str, typer.Argument(help="Team.")],
    usd: Annotated[str, typer.Argument(help="Dollars a month ('none': no cap).")],
    month: Annotated[str | None, typer.Option(
        "--month", help="Only this month, YYYY-MM. \\[default: every month]")] = None,
) -> None:
    """The team's budget: jobs are held in the queue once it is spent."""
    try:
        amount = None if usd == "none" else float(usd.lstrip("$").replace(",", ""))
    except ValueError:
        raise SpecError([("usd", f"'{usd}' is not an amount of dollars; use e.g. 500 or "
                          "'none'")]) from None
    _show_team(client().set_budget(team, amount, month))


def _show_team(t: dict[str, Any]) -> None:
    from gpufleet import ui

    quotas = ", ".join(f"{g}: {t['in_use'].get(g, 0)}/{n}" for g, n in t["quotas"].items())
    budget = "no budget" if t["budget_usd"] is None else \
        f"{ui.usd(t['spent_usd'])} of {ui.usd(t['budget_usd'])} spent in {t['month']}"
    out.print(f"team {t['team']}: quotas {quotas or 'none'}; {budget}; users "
              f"{', '.join(t['users']) or 'none'}", highlight=False)


@admin.command("teams", cls=COMMAND)
def teams_cmd(as_json: Json = False) -> None:
    """Every team: users, quotas against what is in use, budget against what is spent."""
    rows = client().teams()
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("No teams (gpufleet admin user add NAME --team TEAM makes one).")
    for t in rows:
        _show_team(t)


@admin.command("audit", cls=COMMAND)
def audit(
    since: Annotated[str, typer.Option("--since", help="How far back, e.g. 1h, 7d.")] = "30d",
    user: Annotated[str | None, typer.Option("--user", help="Only this user's actions.")] = None,
    as_json: Json = False,
) -> None:
    """Who submitted, cancelled or stopped what, and who changed users, quotas, budgets."""
    rows = client().audit(since, user)
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print(f"Nothing in the audit trail since {since} ago.", highlight=False)
        return
    out.print(_table(("TIME", "USER", "ACTION", "SUBJECT", "DETAIL"), [
        (_when(r["time"]), r["user"], r["action"], r["subject"] or "-", r["detail"] or "")
        for r in rows]))


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> Any:
    """Columns aligned under a header, drawn as the other tables here (rich, no box); cells
    are shown as text (no markup: a detail may hold brackets)."""
    from rich.table import Table
    from rich.text import Text

    t = Table(box=None, pad_edge=False)
    for col in head:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*(Text(cell) for cell in row))
    return t


@app.command(cls=COMMAND)
def usage(
    by: Annotated[str, typer.Option("--by", help="Group by user, team, gpu or job.")] = "user",
    since: Annotated[str, typer.Option("--since", help="How far back, e.g. 7d, 30d.")] = "30d",
    as_json: Json = False,
) -> None:
    """What jobs cost, from the billing ledger: dollars and GPU-hours per user, team, GPU type
    or job; the groups add up to the total exactly."""
    from gpufleet import ui

    got = client().usage(by, since)
    if as_json:
        print_json(got)
        return
    from rich.table import Table

    t = Table(box=None, pad_edge=False)
    for col in (by.upper(), "COST", "GPU-HOURS", "JOBS"):
        t.add_column(col)
    for g in got["groups"]:
        t.add_row(g[by], ui.usd(g["usd"]), f"{g['gpu_hours']:.3f}", str(g["jobs"]))
    t.add_row("total", ui.usd(got["usd"]), f"{got['gpu_hours']:.3f}", "", style="bold")
    out.print(t)
