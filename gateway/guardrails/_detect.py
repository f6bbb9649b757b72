"""The built-in detectors: deterministic patterns, each match validated before it counts.

Every pattern here is ours and linear in practice: no nested unbounded quantifiers, every
repetition that can overlap another is bounded, and each detector is anchored on a
literal or a character class that cannot start a second overlapping attempt
(``tests/unit/test_guardrails_detect.py`` times each one on adversarial inputs).
A match is kept only when its validator agrees (a checksum, a known prefix, a context),
so the detectors are precision-minded: a number that fails Luhn is not a card, an IBAN
that fails mod-97 is not an IBAN (docs/guardrails.md lists each one's rule).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Kind = str
"""``pii``, ``secret`` or ``injection``."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One validated match: which detector, where (character offsets in its text)."""

    detector: str
    kind: Kind
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Detector:
    name: str
    kind: Kind
    pattern: re.Pattern[str]
    valid: Callable[[re.Match[str]], bool] | None = None
    group: int = -1
    """The span masked: the whole match (0), or its last group that took part (-1: a
    secret's value, not its name; the whole match when no group took part)."""
    placeholder: str = ""
    needs: Callable[[str, str], bool] | None = None
    """A cheap necessary condition on (text, lower-cased text): when false the pattern
    cannot match and is not run (a literal every match contains)."""

    def find(self, text: str) -> Iterable[Finding]:
        for m in self.pattern.finditer(text):
            if self.valid is None or self.valid(m):
                group = (m.lastindex or 0) if self.group < 0 else self.group
                start, end = m.span(group)
                yield Finding(self.name, self.kind, start, end)

    @property
    def label(self) -> str:
        return self.placeholder or self.name.upper()


# -- validators ---------------------------------------------------------------------------

def luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card_prefix(d: str) -> bool:
    """A known issuer range (Visa, Mastercard, Amex, Discover, JCB, Diners, UnionPay,
    Maestro) with that issuer's lengths."""
    n = len(d)
    if d[0] == "4":
        return n in (13, 16, 19)
    two, four = int(d[:2]), int(d[:4])
    if 51 <= two <= 55 or 2221 <= four <= 2720:
        return n == 16
    if two in (34, 37):
        return n == 15
    if d.startswith("6011") or two == 65 or 644 <= int(d[:3]) <= 649:
        return 16 <= n <= 19
    if two == 35:  # JCB
        return 16 <= n <= 19
    if d.startswith(("2131", "1800")):  # JCB's older 15-digit ranges
        return n == 15
    if two in (36, 38, 39) or 300 <= int(d[:3]) <= 305:
        return 14 <= n <= 19
    if two == 62:
        return 16 <= n <= 19
    if two in (50, 56, 57, 58, 67) or d.startswith(("0604", "6390")):  # Maestro
        return 12 <= n <= 19
    return False


def _card(m: re.Match[str]) -> bool:
    raw = m.group(0)
    seps = {c for c in raw if not c.isdigit()}
    if len(seps) > 1:
        return False
    digits = "".join(c for c in raw if c.isdigit())
    return 12 <= len(digits) <= 19 and _card_prefix(digits) and luhn(digits)


IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22,
    "BH": 22, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20,
    "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24,
    "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24,
    "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SC": 31,
    "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24,
    "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}
"""IBAN lengths by country (the SWIFT registry); other countries: 15 to 34."""


def mod97(iban: str) -> bool:
    moved = iban[4:] + iban[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return int(number) % 97 == 1


def _iban(m: re.Match[str]) -> bool:
    iban = m.group(0).replace(" ", "").upper()
    want = IBAN_LENGTHS.get(iban[:2])
    if want is not None and len(iban) != want:
        return False
    return 15 <= len(iban) <= 34 and mod97(iban)


def _is_ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) <= 255 for p in parts)


def _phone(m: re.Match[str]) -> bool:
    raw = m.group(0)
    main = re.split(r"\s?(?:x|ext\.?)\s?", raw)[0]
    digits = sum(c.isdigit() for c in main)
    if not 10 <= digits <= 15:
        return False
    if _is_ipv4(main) or re.fullmatch(r"\d{4}[-./]\d{2}[-./]\d{2}.*", main):
        return False  # an address or a date, not a number to call
    if main.startswith(("+", "(")):
        return True
    groups = re.split(r"[ .-]", main)
    if len(groups) < 2 or len({c for c in main if c in " .-"}) > 1:
        return False  # one long number (an id), or mixed separators
    # A national number: a trunk 0 with two or more groups, or three or more groups.
    return (main[0] == "0" and 10 <= digits <= 11) or len(groups) >= 3


def _ipv4(m: re.Match[str]) -> bool:
    text = m.string
    before = text[m.start() - 1] if m.start() else ""
    after = text[m.end():m.end() + 2]
    # "v1.2.3.4", "1.2.3.4.5" and "1.2.3.4-beta" are versions, not addresses.
    if before in ("v", "V", ".") or (after[:1] == "." and after[1:2].isdigit()):
        return False
    return after[:1] != "-"


def _ipv6(m: re.Match[str]) -> bool:
    text = m.group(0)
    if sum(1 for g in text.split(":") if g) < 3:
        return False  # "d::" (C++'s std::) and the like are valid but not addresses
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _b64json(part: str) -> dict[str, object] | None:
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        doc = json.loads(raw)
    except (binascii.Error, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _jwt(m: re.Match[str]) -> bool:
    header = _b64json(m.group(0).split(".", 1)[0])
    return header is not None and "alg" in header


def entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    counts: dict[str, int] = {}
    for c in value:
        counts[c] = counts.get(c, 0) + 1
    n = len(value)
    return -sum(k / n * math.log2(k / n) for k in counts.values())


_NOT_A_VALUE = re.compile(
    r"(?i)^(?:\$\{|\$\(|\{\{|<|%\(|os\.|env\.|process\.|getenv|none|null|true|false|"
    r"undefined|example|changeme|your|my[_-]?|placeholder|redacted|x{4}|\*{4}|\.\.\.)")


def _high_entropy(m: re.Match[str]) -> bool:
    value = m.group(1)
    if len(value) < 16 or _NOT_A_VALUE.search(value):
        return False
    if re.fullmatch(r"[A-Za-z_]+(?:\.[A-Za-z_]+)*(?:\(\))?", value):
        return False  # an identifier or attribute path: a variable, not a secret
    classes = sum(bool(re.search(p, value)) for p in ("[a-z]", "[A-Z]", "[0-9]", r"[^\w]"))
    return classes >= 2 and entropy(value) >= 3.3


def _openai(m: re.Match[str]) -> bool:
    rest = m.group(0).split("-", 1)[1]
    return (len(rest) >= 32 and any(c.isdigit() for c in rest)
            and any(c.isalpha() for c in rest) and entropy(rest) >= 3.5)


# -- the detectors --------------------------------------------------------------------------

_W = r"(?<![\w.+-])"
"""Not glued to a word before (an email's or a number's start)."""

_INJECTION = [
    r"(?:ignore|disregard|forget|override|bypass)\s{1,3}(?:all\s{1,3}|any\s{1,3}|the\s{1,3}|"
    r"your\s{1,3}|of\s{1,3})?(?:previous|prior|above|earlier|preceding|system|original)"
    r"\s{1,3}(?:instructions?|prompts?|rules|directions|guidelines|messages?)",
    r"(?:reveal|print|show|repeat|output|leak)\s{1,3}(?:me\s{1,3})?(?:your|the)\s{1,3}"
    r"(?:(?:hidden|secret|initial|original)\s{1,3})?(?:system\s{1,3}prompt|instructions)",
    r"you\s{1,3}are\s{1,3}now\s{1,3}(?:DAN|in\s{1,3}developer\s{1,3}mode|an?\s{1,3}"
    r"(?:unrestricted|unfiltered|jailbroken)\b)",
    r"\bdo\s{1,3}anything\s{1,3}now\b",
    r"(?:enable|enter|activate)\s{1,3}(?:developer|god|jailbreak|DAN)\s{1,3}mode",
    r"pretend\s{1,3}(?:that\s{1,3})?you\s{1,3}(?:have|are\s{1,3}under)\s{1,3}no\s{1,3}"
    r"(?:restrictions|rules|guidelines|filters)",
    r"</?(?:system|im_start|im_end)>|\[/?INST\]|<\|im_start\|>",
]

_AWS_IDS = ("AKIA", "ASIA", "ABIA", "ACCA")
_SECRET_WORDS = ("secret", "token", "passw", "pwd", "key", "credential")
_INJECTION_WORDS = ("ignore", "disregard", "forget", "override", "bypass", "reveal",
                    "print", "show", "repeat", "output", "leak", "now", "mode", "pretend",
                    "system>", "im_start", "im_end", "inst]")
"""A word every injection pattern contains (lower-cased; spacing is the patterns')."""
_IBAN_LEAD = re.compile(r"[A-Z]{2}\d{2}")

DETECTORS: tuple[Detector, ...] = (
    # Secrets first: where two detectors claim overlapping text, the earlier one wins.
    Detector("private_key", "secret", re.compile(
        r"-----BEGIN [A-Z0-9]{1,12}(?: [A-Z0-9]{1,12}){0,2} ?PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[A-Za-z0-9+/=:,\s\\-]{0,16384}?-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?"
        r"-----|[A-Za-z0-9+/=:,\s\\]{0,16384})"
        r"|-----BEGIN PRIVATE KEY-----(?:[A-Za-z0-9+/=\s\\]{0,16384}?-----END PRIVATE "
        r"KEY-----|[A-Za-z0-9+/=\s\\]{0,16384})"), placeholder="PRIVATE_KEY",
        needs=lambda t, low: "PRIVATE KEY" in t),
    Detector("jwt", "secret", re.compile(
        r"(?<![\w-])eyJ[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{4,8192}\.[A-Za-z0-9_-]{16,1024}"
        r"(?![\w-])"), _jwt, placeholder="JWT",
        needs=lambda t, low: "eyJ" in t),
    Detector("aws_key", "secret", re.compile(
        r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}(?![A-Za-z0-9])"
        r"|(?i:aws_?secret_?access_?key|secret_?access_?key)[\"']?\s{0,3}[:=]\s{0,3}[\"']?"
        r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"), placeholder="AWS_KEY",
        needs=lambda t, low: "ccess" in low or any(p in t for p in _AWS_IDS)),
    Detector("github_token", "secret", re.compile(
        r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{60,255})"
        r"(?![A-Za-z0-9_])"), placeholder="GITHUB_TOKEN",
        needs=lambda t, low: "gh" in t or "github_pat_" in t),
    Detector("anthropic_key", "secret", re.compile(
        r"(?<![A-Za-z0-9_-])sk-ant-[a-z0-9]{2,12}-[A-Za-z0-9_-]{32,256}(?![A-Za-z0-9_-])"),
        placeholder="ANTHROPIC_KEY",
        needs=lambda t, low: "sk-ant-" in t),
    Detector("openai_key", "secret", re.compile(
        r"(?<![A-Za-z0-9_-])sk-(?!ant-)(?:[a-z]{2,8}-)?[A-Za-z0-9_-]{32,256}"
        r"(?![A-Za-z0-9_-])"), _openai, placeholder="OPENAI_KEY",
        needs=lambda t, low: "sk-" in t),
    Detector("generic_secret", "secret", re.compile(
        r"(?=[stpacSTPAC])(?i:secret|token|passw(?:or)?d|passwd|pwd|api[_-]?key|apikey|"
        r"access[_-]?key|"
        r"auth[_-]?key|credentials?)[A-Za-z0-9_.-]{0,30}[\"']?\s{0,3}(?::=|=>|[:=])\s{0,3}"
        r"[\"'`]?([^\s\"'`,;<>(){}\[\]]{16,256})"), _high_entropy,
        placeholder="SECRET",
        needs=lambda t, low: any(w in low for w in _SECRET_WORDS)),
    Detector("card", "pii", re.compile(
        r"(?<![\w.-])\d(?:[ -]?\d){11,18}(?![\w-]|\.\d)"), _card, placeholder="CARD"),
    Detector("iban", "pii", re.compile(
        r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?"
        r"(?![A-Za-z0-9])"), _iban, placeholder="IBAN",
        needs=lambda t, low: _IBAN_LEAD.search(t) is not None),
    Detector("ssn", "pii", re.compile(
        r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])"),
        placeholder="SSN",
        needs=lambda t, low: "-" in t),
    Detector("email", "pii", re.compile(
        _W + r"[A-Za-z0-9_%+-][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})"
        r"(?:\.[A-Za-z0-9-]{1,63}){0,6}\.[A-Za-z]{2,24}(?![A-Za-z0-9-])"),
        placeholder="EMAIL",
        needs=lambda t, low: "@" in t),
    Detector("phone", "pii", re.compile(
        r"(?<![\w+.-])(?:\+\d{1,3}[ .-]?(?:\(0\)[ .-]?)?|\(\d{1,5}\)[ .-]?)?\d{1,5}"
        r"(?:[ .-]\d{1,7}){0,4}(?:\s?(?:x|ext\.?)\s?\d{1,5})?(?![\w-]|\.\d)"), _phone,
        placeholder="PHONE"),
    Detector("ip", "pii", re.compile(
        r"(?<![\w.:])(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|"
        r"[1-9]?\d)){3}(?!\w|:[0-9A-Fa-f]{0,4}:)|(?<![\w:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}"
        r"(?![\w:])"), lambda m: _ipv6(m) if ":" in m.group(0) else _ipv4(m),
        placeholder="IP"),
    Detector("prompt_injection", "injection",
             # The lead (a word's start, one of the patterns' first letters) lets the
             # engine skip most positions at once: 4x faster on prose.
             re.compile(r"(?<![\w<\[])(?=[idfobrpslyeaDIFOBRPSLYEA<\[])(?:"
                        + "|".join(f"(?:{p})" for p in _INJECTION) + ")", re.IGNORECASE),
             placeholder="INJECTION",
        needs=lambda t, low: any(w in low for w in _INJECTION_WORDS)),
)
"""In priority order (secrets, then PII, then injection)."""

BY_NAME = {d.name: d for d in DETECTORS}
NAMES = tuple(BY_NAME)


def scan(text: str, detectors: Iterable[Detector]) -> list[Finding]:
    """Validated, non-overlapping findings in ``text``, in text order. Of two overlapping
    findings the one of the earlier detector (in ``detectors``' order) is kept."""
    taken: list[Finding] = []
    low = text.lower()
    for det in detectors:
        if det.needs is not None and not det.needs(text, low):
            continue
        for f in det.find(text):
            if all(f.end <= t.start or f.start >= t.end for t in taken):
                taken.append(f)
    taken.sort(key=lambda f: f.start)
    return taken
