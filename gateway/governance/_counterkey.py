"""Counter keys: the one type that writes and reads the names of governance counters.

Every limit a request charges is a counter named by a key string. The strings are stored
(``gov_counters``, ``counters``, ``authority_accounts``, alert events), journalled and
sent between the planes, so their format is fixed to the byte:

- ``key:<key id>:rpm``, ``key:<key id>:tpm``, and the same for ``team:<team id>``: the
  key's or team's request and token buckets;
- ``key:<key id>:usd:<day|month>:<period>``, ``team:<team id>:usd:…``,
  ``team:<team id>:tokens:day:<period>``: the key's or team's µUSD and token windows;
- ``rule:<uid>:<scope>:rpm``, ``rule:<uid>:<scope>:tpm``: a policy rate rule's buckets;
- ``rule:<uid>:<scope>:tokens:<day|month>:<period>``: a policy token quota's windows;
- ``rule:<uid>:<scope>:inflight``: a policy concurrency rule's open requests (a window
  without a calendar period: each permit reserves 1 and its settlement frees it);
- ``account:<uid>:<scope>:<day|month>:<period>``: a policy budget's µUSD account (also
  the lease protocol's account name);
- ``member:<team id>:<user>:<tokens|usd>:<day|month>:<period>``: a user's budget within a
  team (its member row or the team's default member budget);
- ``user:<user>:<tokens|usd>:<day|month>:<period>``: a user's budget across every team;
- ``key:<key id>``, ``team:<team id>`` and ``policy``: what a snapshot-mismatch refusal
  names (the key, the team or the policy generation that changed).

A period is ``YYYY-MM-DD`` for a day and ``YYYY-MM`` for a month (UTC). Key and team
ids (``key_…``, ``team_…``) and rule uids (policy names, rule names and the ``uid``
pattern) never hold ``:``; a scope (``team=<name>``, ``user=<user>``,
``team=<name>,user=<user>``, ``key=<key id>``) and a user name may hold any character, so
:meth:`CounterKey.parse` reads subject and id from the left, measure, window and period
from the right, and takes the scope (a member's or user's counter: the user name) as
what lies between.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

import msgspec

Subject = Literal["key", "team", "rule", "account", "member", "user", "policy"]
Measure = Literal["rpm", "tpm", "tokens", "usd", "inflight"]
Bucket = Literal["rpm", "tpm"]
Quantity = Literal["tokens", "usd"]
Window = Literal["day", "month"]
Owner = Literal["key", "team", "member", "user", "policy"]

_HOLDERS: dict[str, Literal["key", "team"]] = {"key": "key", "team": "team"}
_BUCKETS: dict[str, Bucket] = {"rpm": "rpm", "tpm": "tpm"}
_QUANTITIES: dict[str, Quantity] = {"tokens": "tokens", "usd": "usd"}
_WINDOWS: dict[str, Window] = {"day": "day", "month": "month"}
_PERIODS = {"day": re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
            "month": re.compile(r"[0-9]{4}-[0-9]{2}")}


class CounterKey(msgspec.Struct, frozen=True, kw_only=True):
    """One counter's name taken apart; :attr:`text` is the stored string, :meth:`parse`
    reads one back (``CounterKey.parse(k.text) == k`` for every key built here)."""

    subject: Subject
    id: str = ""
    """The key id, team id (of a team or a member) or rule uid ("" for ``policy`` and
    ``user``)."""
    scope: str = ""
    """A rule's or account's scope: ``team=<name>``, ``user=<user>`` or both; a member's
    or user's user name ("" else)."""
    measure: Measure | None = None
    """``rpm``/``tpm``: a bucket; ``tokens``/``usd``: a window (an account is ``usd``);
    ``inflight``: a rule's open requests; None: a bare subject, as a refusal names it."""
    window: Window | None = None
    """The calendar window of a window or account: ``day`` or ``month``."""
    period: str = ""
    """The window's UTC period: ``2026-11-29`` or ``2026-11``."""

    @classmethod
    def key(cls, key_id: str) -> CounterKey:
        """The key ``key_id`` itself (bare; :meth:`bucket`/:meth:`windowed` its counters)."""
        return cls(subject="key", id=key_id)

    @classmethod
    def team(cls, team_id: str) -> CounterKey:
        return cls(subject="team", id=team_id)

    @classmethod
    def rule(cls, uid: str, scope: str) -> CounterKey:
        """A policy rule for one scope (give it a :meth:`bucket` or a tokens
        :meth:`windowed`; a budget's counter is an :meth:`account`)."""
        return cls(subject="rule", id=uid, scope=scope)

    @classmethod
    def account(cls, uid: str, scope: str, window: Window, period: str) -> CounterKey:
        """A policy budget's µUSD account for one scope and period."""
        return cls(subject="account", id=uid, scope=scope, measure="usd", window=window,
                   period=period)

    @classmethod
    def member(cls, team_id: str, user: str) -> CounterKey:
        """A user's budget within team ``team_id`` (give it a :meth:`windowed`)."""
        return cls(subject="member", id=team_id, scope=user)

    @classmethod
    def user(cls, user: str) -> CounterKey:
        """A user's budget across every team (give it a :meth:`windowed`)."""
        return cls(subject="user", scope=user)

    @classmethod
    def policy(cls) -> CounterKey:
        """The policy generation (what a refusal names when the policy changed)."""
        return _POLICY

    def bucket(self, measure: Bucket) -> CounterKey:
        """This key's, team's or rule's RPM or TPM bucket."""
        return CounterKey(subject=self.subject, id=self.id, scope=self.scope,
                          measure=measure)

    def in_flight(self) -> CounterKey:
        """This rule's open-request counter (a concurrency rule's slots)."""
        return CounterKey(subject=self.subject, id=self.id, scope=self.scope,
                          measure="inflight")

    def windowed(self, measure: Quantity, window: Window, period: str) -> CounterKey:
        """This key's, team's (tokens or µUSD) or rule's (tokens) calendar window."""
        return CounterKey(subject=self.subject, id=self.id, scope=self.scope,
                          measure=measure, window=window, period=period)

    @property
    def text(self) -> str:
        """The counter key string, as stored."""
        subject, measure = self.subject, self.measure
        if subject == "policy":
            return "policy"
        if subject == "rule" or subject == "account" or subject == "member":
            head = f"{subject}:{self.id}:{self.scope}"
        elif subject == "user":
            head = f"user:{self.scope}"
        else:
            head = f"{subject}:{self.id}"
        if measure is None:
            return head
        if measure == "rpm" or measure == "tpm" or measure == "inflight":
            return f"{head}:{measure}"
        if subject == "account":
            return f"{head}:{self.window}:{self.period}"
        return f"{head}:{measure}:{self.window}:{self.period}"

    def __str__(self) -> str:
        return self.text

    @property
    def owner(self) -> Owner:
        """Whose limit this is: a key's, a team's, or a policy's (rule, account, and the
        policy generation itself)."""
        if self.subject == "key":
            return "key"
        if self.subject == "team":
            return "team"
        if self.subject == "member" or self.subject == "user":
            return self.subject
        return "policy"

    @staticmethod
    def parse(text: str) -> CounterKey | None:
        """The key ``text`` names, or None if it is not a counter key of this format."""
        return _parse(text)


_POLICY = CounterKey(subject="policy")


def _period_ok(window: str, period: str) -> bool:
    pattern = _PERIODS.get(window)
    return pattern is not None and pattern.fullmatch(period) is not None


@lru_cache(maxsize=8192)
def _parse(text: str) -> CounterKey | None:
    # Cached: the request path reads the same few keys again and again (per-team
    # metrics), and a CounterKey is immutable.
    if text == "policy":
        return _POLICY
    head, sep, rest = text.partition(":")
    ident, sep, tail = rest.partition(":") if sep else ("", "", "")
    if not ident:
        return None
    holder = _HOLDERS.get(head)
    if holder is not None:
        if not sep:
            return CounterKey(subject=holder, id=ident)
        bucket = _BUCKETS.get(tail)
        if bucket is not None:
            return CounterKey(subject=holder, id=ident, measure=bucket)
        parts = tail.split(":")
        if len(parts) != 3:
            return None
        quantity, window = _QUANTITIES.get(parts[0]), _WINDOWS.get(parts[1])
        if quantity is None or window is None or not _period_ok(window, parts[2]):
            return None
        return CounterKey(subject=holder, id=ident, measure=quantity, window=window,
                          period=parts[2])
    if head == "rule":
        scope, _, last = tail.rpartition(":")
        bucket = _BUCKETS.get(last)
        if bucket is not None:
            return CounterKey(subject="rule", id=ident, scope=scope,
                              measure=bucket) if scope else None
        if last == "inflight":
            return CounterKey(subject="rule", id=ident, scope=scope,
                              measure="inflight") if scope else None
        parts = tail.rsplit(":", 3)
        if len(parts) != 4 or parts[1] != "tokens":
            return None
        window = _WINDOWS.get(parts[2])
        if not parts[0] or window is None or not _period_ok(window, parts[3]):
            return None
        return CounterKey(subject="rule", id=ident, scope=parts[0], measure="tokens",
                          window=window, period=parts[3])
    if head == "member" or head == "user":
        return _parse_person(head, rest)
    if head == "account":
        parts = tail.rsplit(":", 2)
        if len(parts) != 3:
            return None
        window = _WINDOWS.get(parts[1])
        if not parts[0] or window is None or not _period_ok(window, parts[2]):
            return None
        return CounterKey.account(ident, parts[0], window, parts[2])
    return None


def _parse_person(head: str, rest: str) -> CounterKey | None:
    """``member:<team id>:<user>:…`` or ``user:<user>:…`` (rest: after ``head:``)."""
    if head == "member":
        ident, sep, rest = rest.partition(":")
        if not ident or not sep:
            return None
    parts = rest.rsplit(":", 3)
    if len(parts) != 4 or not parts[0]:
        return None
    quantity, window = _QUANTITIES.get(parts[1]), _WINDOWS.get(parts[2])
    if quantity is None or window is None or not _period_ok(window, parts[3]):
        return None
    person = CounterKey.member(ident, parts[0]) if head == "member" else CounterKey.user(
        parts[0])
    return person.windowed(quantity, window, parts[3])
