"""Kubernetes resource quantities, read exactly as kube-apiserver reads and stores them.

One parser for every reader of a quantity in the tree (GPU004, the extender's card sizes and pod
requests, the audit's capacity sums), so the dry-run, the webhook and the scheduler side can never
read one manifest three ways. It follows the Go code of `k8s.io/apimachinery`
`pkg/api/resource` (`quantity.go`, `suffix.go`, `amount.go`, release v0.34, the one Kubernetes 1.34
ships), including its corners, and its own table tests are ported to
`tests/unit/policies/test_quantity.py`:

- Grammar: an optional sign, digits with at most one `.` (`1.`, `.5` and even `.` are numbers),
  then one suffix: decimal SI (`n u m "" k M G T P E`), binary SI (`Ki Mi Gi Ti Pi Ei`) or an
  exponent (`e3`, `E-3`, `e+3`). `K`, `1KB`, `1kk`, `--1`, an empty string, inner or surrounding
  whitespace are refused by the parser itself; a manifest field is trimmed first (Go's
  `strings.TrimSpace`, as `Quantity.UnmarshalJSON` does), so `" 2 "` in a manifest is 2.
- Values are exact: a decimal mantissa and a power of ten, never a float. A non-zero value finer
  than 10^-9 is rounded away from zero to the next nano (`0.1n` is `1n`); a binary-SI value is
  capped at 2^63-1 (`9Ei`); a decimal one is not capped.
- The exponent of `e<n>` is read as a 64-bit number and then cut to 32 bits, as Go does
  (`1e4294967296` is 1), and scale arithmetic wraps at 32 bits the same way.
- What the apiserver stores (`Quantity.text`) is the input string itself where Go's parser keeps
  it (`+2`, `1k`, `1Ki`, `1.500k`), otherwise the canonical form (`2000m` becomes `2`, `1000`
  becomes `1k`, `1.5Gi` becomes `1536Mi`). Like Go 1.34, a decimal-SI value whose canonical
  exponent has no suffix (10^21 and above) loses the exponent when written (`1000E` is stored as
  `1`); `stored` re-reads the written form, which is what an admission webhook and the scheduler
  see.

Nothing here is ever expanded to a power of ten beyond what a caller asks for, so a hostile
`1e2147483647` costs nothing.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import fractions
import functools
import math
import re

INT64_MAX = (1 << 63) - 1
# The largest amount whose milli-value Kubernetes computes exactly (`MaxMilliValue`): its validation
# of an extended resource (`MilliValue() % 1000 == 0`) overflows past it and refuses or accepts at
# random, so a policy that wants to agree with it allows nothing larger.
MAX_MILLI_VALUE = INT64_MAX // 1000
# Go reads numbers of any length; past this many significant digits we refuse instead (Python's own
# int() limit is 4300 digits, and no resource amount comes near it).
MAX_DIGITS = 4000
_NANO = -9
_MAX_INT64_DIGITS = 18  # Go's maxInt64Factors: a fast-path mantissa has at most 18 digits


class Format(enum.StrEnum):
    """How a quantity is written back; Go keeps the kind of suffix it was parsed with."""

    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_SUFFIX_OF: dict[int, str] = {exponent: name for name, exponent in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_SUFFIX_OF: dict[int, str] = {exponent: name for name, exponent in _BINARY_SUFFIXES.items()}
_SUFFIX_CHARACTERS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
_EXPONENT_DIGITS = re.compile(r"^[+-]?[0-9]+$")
# unicode.IsSpace in Go (White_Space), which strings.TrimSpace trims; Python's str.strip would also
# trim U+001C..U+001F, which Go keeps.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _ten(power: int) -> int:
    """10**power for power >= 0, typed as an int."""
    return int(10**power)


def _int32(value: int) -> int:
    """`value` wrapped to a Go int32, the type of every scale and exponent in the Go code."""
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


@dataclasses.dataclass(frozen=True)
class Quantity:
    """A parsed quantity: `unscaled` x 10^`exponent`, the format it came in, and its stored text."""

    unscaled: int
    exponent: int
    format: Format
    text: str
    wide: bool = False  # held in Go's arbitrary-precision form (inf.Dec), which canonicalises slightly differently
    capped: bool = False  # a binary-SI value Go cut to 2^63-1

    def __str__(self) -> str:
        return self.text

    @property
    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self.unscaled > 0) - (self.unscaled < 0)

    def is_integer(self) -> bool:
        """Whether the value is a whole number."""
        if self.exponent >= 0 or self.unscaled == 0:
            return True
        if -self.exponent > len(str(abs(self.unscaled))):
            return False
        return self.unscaled % _ten(-self.exponent) == 0

    def as_int64(self) -> int | None:
        """The value when it is a whole number within Go's int64; None otherwise."""
        if self.unscaled == 0:
            return 0
        if not self.is_integer() or self.exponent > 19:
            return None
        value = self.unscaled * 10**self.exponent if self.exponent >= 0 else self.unscaled // 10 ** (-self.exponent)
        return value if -INT64_MAX - 1 <= value <= INT64_MAX else None

    def same_value(self, other: Quantity) -> bool:
        """Whether two quantities are equal in value, whatever their spelling (Go's `Cmp == 0`)."""
        return _normal(self) == _normal(other)

    def fraction(self) -> fractions.Fraction:
        """The exact value. Raises OverflowError past 10^4096 (no resource is near that)."""
        if self.unscaled == 0:
            return fractions.Fraction(0)
        if abs(self.exponent) > 4096:
            raise OverflowError(f"quantity {self.text!r} is too large to expand")
        return fractions.Fraction(self.unscaled) * fractions.Fraction(10) ** self.exponent


def _normal(found: Quantity) -> tuple[int, int]:
    if found.unscaled == 0:
        return 0, 0
    mantissa, exponent = found.unscaled, found.exponent
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    return mantissa, exponent


ZERO = Quantity(unscaled=0, exponent=0, format=Format.DECIMAL_SI, text="0")


def parse(text: str) -> Quantity:
    """A quantity string as Go's `resource.ParseQuantity` reads it; QuantityError if it is none."""
    if not isinstance(text, str) or not text:
        raise QuantityError("a quantity must not be empty")
    if text == "0":
        return ZERO
    positive, value, num, denom, suffix = _scan(text)
    base, exponent, format_ = _interpret(suffix, text)
    if format_ is Format.BINARY_SI:
        scale = 0
        if exponent >= 0 and not denom:
            mantissa = 1 << exponent
            precision = 15 - len(num) - (exponent * 3) // 10 - 1
        else:
            mantissa, precision = 1, -1
    else:
        scale, mantissa = exponent, 1
        precision = _MAX_INT64_DIGITS - (len(num) + len(denom))
    if precision >= 0:
        scale = _int32(scale - len(denom))
        if scale >= _NANO:
            shifted = num + denom
            digits = int(shifted)
            result = digits * mantissa
            if result <= INT64_MAX:
                if not positive:
                    result = -result
                if format_ is Format.BINARY_SI:
                    keep = exponent % 10 == 0 and digits & 0x07 != 0
                else:
                    keep = scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
                return _quantity(result, scale, format_, text if keep else None)
    return _parse_big(value, base=base, exponent=exponent, format_=format_, text=text)


def _parse_big(value: str, *, base: int, exponent: int, format_: Format, text: str) -> Quantity:
    """Go's arbitrary-precision path (`inf.Dec`): rounding to nano, the binary cap, wrapping scales."""
    unscaled, inf_scale = _decimal(value, text)
    if base == 10:
        inf_scale = _int32(inf_scale + _int32(-exponent))
    else:
        unscaled *= 1 << exponent
    negative = unscaled < 0
    magnitude = -unscaled if negative else unscaled
    if magnitude and inf_scale > -_NANO:
        drop = inf_scale + _NANO
        if drop > len(str(magnitude)):
            magnitude = 1  # below one nano: rounded up to the smallest non-zero amount
        else:
            whole, rest = divmod(magnitude, 10**drop)
            magnitude = whole + (1 if rest else 0)
        inf_scale = -_NANO
    capped = format_ is Format.BINARY_SI and _exceeds(magnitude, inf_scale, INT64_MAX)
    if capped:
        magnitude, inf_scale = INT64_MAX, 0
    if format_ is Format.BINARY_SI and magnitude and _below_one(magnitude, inf_scale):
        format_ = Format.DECIMAL_SI
    # No wrap here: Go keeps the scale as it is (and spends its time on such a number).
    found = _quantity(-magnitude if negative else magnitude, -inf_scale, format_, None, wide=True)
    return dataclasses.replace(found, capped=True) if capped else found


def _exceeds(magnitude: int, inf_scale: int, bound: int) -> bool:
    if magnitude == 0:
        return False
    if inf_scale <= 0:
        return -inf_scale > 19 or magnitude * _ten(-inf_scale) > bound
    if inf_scale > len(str(magnitude)):
        return False  # below one
    return magnitude > bound * _ten(inf_scale)


def _below_one(magnitude: int, inf_scale: int) -> bool:
    return inf_scale > 0 and (inf_scale > len(str(magnitude)) or magnitude < _ten(inf_scale))


def _quantity(unscaled: int, exponent: int, format_: Format, kept: str | None, *, wide: bool = False) -> Quantity:
    found = Quantity(unscaled=unscaled, exponent=exponent, format=format_, text="", wide=wide)
    return dataclasses.replace(found, text=kept if kept is not None else canonical(found))


def _scan(text: str) -> tuple[bool, str, str, str, str]:
    """Go's `parseQuantityString`: (positive, value, numerator, denominator, suffix)."""
    positive, pos, end = True, 0, len(text)
    if text[0] == "-":
        positive, pos = False, 1
    elif text[0] == "+":
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    if pos >= end:
        return positive, text, num, "", ""
    denom = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
        if pos >= end:
            return positive, text, num, denom, ""
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARACTERS:
        pos += 1
    if pos >= end:
        return positive, value, num, denom, text[suffix_start:]
    if text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(f"{text!r} is not a quantity (a number, then one of the suffixes)")
    return positive, value, num, denom, text[suffix_start:]


def _interpret(suffix: str, text: str) -> tuple[int, int, Format]:
    """Go's suffixer: (base, exponent, format) of a suffix."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], Format.DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], Format.BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE" and _EXPONENT_DIGITS.match(suffix[1:]):
        exponent = int(suffix[1:])
        if -INT64_MAX - 1 <= exponent <= INT64_MAX:
            return 10, _int32(exponent), Format.DECIMAL_EXPONENT
    raise QuantityError(f"{text!r} has an unknown suffix {suffix!r}")


def _decimal(value: str, text: str) -> tuple[int, int]:
    """`inf.Dec.SetString`: an optionally signed decimal with at least one digit -> (unscaled, scale)."""
    body = value[1:] if value[:1] in ("+", "-") else value
    whole, dot, fraction = body.partition(".")
    digits = whole + fraction
    if not digits or not digits.isdigit() or not digits.isascii():
        raise QuantityError(f"{text!r}: unable to parse the numeric part")
    if len(digits.lstrip("0")) > MAX_DIGITS:
        raise QuantityError(f"{text[:20]!r}...: more than {MAX_DIGITS} digits")
    unscaled = int(digits)
    return (-unscaled if value.startswith("-") else unscaled), (len(fraction) if dot else 0)


def canonical(found: Quantity) -> str:
    """Go's `Quantity.String()` for a quantity with no kept text (CanonicalizeBytes)."""
    if found.unscaled == 0:
        return "0"
    format_ = found.format
    if format_ is Format.BINARY_SI:
        if _exceeds(abs(found.unscaled), -found.exponent, 1023) and found.is_integer():
            value = found.as_int64()
            if value is not None:
                return _base1024(value)
        format_ = Format.DECIMAL_SI
    mantissa, exponent = found.unscaled, found.exponent
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent = _int32(exponent + 1)
    mantissa, exponent = _multiple_of_three(mantissa, exponent, wide=found.wide)
    if format_ is Format.DECIMAL_EXPONENT:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    # Kubernetes 1.34 drops an exponent that has no decimal-SI suffix (10^21 and up).
    return f"{mantissa}{_DECIMAL_SUFFIX_OF.get(exponent, '')}"


def _go_remainder(value: int, divisor: int) -> int:
    """Go's `%`: the sign follows the dividend."""
    rest = abs(value) % divisor
    return -rest if value < 0 else rest


def _multiple_of_three(mantissa: int, exponent: int, *, wide: bool) -> tuple[int, int]:
    """Lower the exponent to a multiple of three, as Go does for its int64 and inf.Dec forms."""
    if not wide:
        rest = _go_remainder(exponent, 3)
        if rest == 0:
            return mantissa, exponent
        factor, step = (10, 1) if rest in (1, -2) else (100, 2)
        if abs(mantissa * factor) <= INT64_MAX:
            return mantissa * factor, _int32(exponent - step)
    while _go_remainder(exponent, 3) != 0:
        mantissa *= 10
        exponent = _int32(exponent - 1)
    return mantissa, exponent


def _base1024(value: int) -> str:
    times = 0
    while value % 1024 == 0:
        value //= 1024
        times += 1
    return f"{value}{_BINARY_SUFFIX_OF.get(times * 10, '')}"


# --- manifest fields --------------------------------------------------------------------------------


def decode(value: object) -> Quantity:
    """A manifest's quantity field as the apiserver decodes it (`Quantity.UnmarshalJSON`).

    A string is trimmed of Go whitespace and parsed; an integer or float is parsed from the text a
    JSON encoder writes for it (a YAML `1e3` reaches the apiserver as the number 1000); null is zero.
    Booleans, mappings and lists are not quantities.
    """
    if value is None:
        return ZERO
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return parse(str(value))
    if isinstance(value, float):
        return parse(_json_number(value))
    if isinstance(value, str):
        return parse(value.strip(_GO_SPACE))
    raise QuantityError(f"{value!r} is not a quantity")


def _wrap64(value: int) -> int:
    """`value` as a Go int64 holds it after overflow (two's complement)."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def milli_value(found: Quantity) -> int:
    """Go's `Quantity.MilliValue()`, overflow included (it wraps or reads 0; Go calls it undefined).

    kube-apiserver validates an extended resource with `MilliValue() % 1000 == 0`, so past
    `MAX_MILLI_VALUE` its verdict depends on these overflows; `passes_integer_validation` replays it.
    """
    if found.unscaled == 0:
        return 0
    if not found.wide:  # Go's int64Amount{value, scale}.AsScaledInt64(-3)
        value, scale = found.unscaled, found.exponent
        if scale < -3:
            divisor = _ten(-3 - scale)
            whole = abs(value) // divisor
            if abs(value) % divisor:
                whole += 1
            return whole if value > 0 else -whole
        steps = scale + 3
        if steps in (0, 1, 2, 3, 6, 9):
            return _wrap64(value * _ten(steps))
        for _ in range(steps):
            if abs(value * 10) > INT64_MAX:
                return 0
            value *= 10
        return value
    if found.capped:  # inf.Dec set to 2^63-1 at scale 0: Int64() * 1000, wrapped
        return _wrap64(found.unscaled * 1000)
    # inf.Dec rounded to scale 9: ceil(value * 1000) in big integers, then its low 64 bits.
    magnitude = abs(found.unscaled)
    shift = found.exponent + 3
    if shift >= 0:
        low = (magnitude % (1 << 64)) * pow(10, shift, 1 << 64)
        result = _wrap64(low)
    else:
        whole, rest = divmod(magnitude, _ten(-shift))
        result = _wrap64(_wrap64(whole) + (1 if rest else 0))
    return result if found.unscaled > 0 else -result


def passes_integer_validation(found: Quantity) -> bool:
    """Whether kube-apiserver accepts `found` for an extended resource (`ValidateResourceQuantityValue`).

    Non-negative, and `MilliValue() % 1000 == 0` with Go's overflow: `1000E` passes (its milli-value
    reads 0), 22-digit numbers mostly fail. Pod validation runs on the decoded value, before the
    value is written back (and `1000E` is then written as `1`).
    """
    return found.sign >= 0 and _go_remainder(milli_value(found), 1000) == 0


def decoded(value: object) -> Quantity | None:
    """`decode`, with None for what is not a quantity."""
    try:
        return decode(value)
    except QuantityError:
        return None


def stored(value: object) -> Quantity | None:
    """What the cluster keeps of a manifest's quantity: decoded, written, read back; None if invalid.

    This is the value an admission webhook, the scheduler and the extender see, so the dry-run
    judges it too (it differs from `decode` only where Go 1.34 writes a value it cannot spell).
    """
    if type(value) is str:
        return _stored_text(value)
    if type(value) is int:  # a manifest's bare number (dry-run, a hand-made review): as cacheable
        return _stored_int(value)
    return _stored(value)


# Admission reviews carry quantities as the apiserver wrote them back, a handful of short strings
# repeated across reviews: parsing each again cost more than a whole policy (bench/webhook_load.py).
# Quantity is frozen, so one parsed value can be shared; the cache is bounded.
@functools.lru_cache(maxsize=1024)
def _stored_text(value: str) -> Quantity | None:
    return _stored(value)


@functools.lru_cache(maxsize=256)
def _stored_int(value: int) -> Quantity | None:
    return _stored(value)


def _stored(value: object) -> Quantity | None:
    try:
        return parse(decode(value).text)
    except QuantityError:
        return None


def count(value: object) -> int | None:
    """A whole, non-negative amount of an extended resource as the cluster stores it; else None.

    `2`, `"2"`, `"+2"`, `"2000m"`, `"2e0"` and `"0.002k"` are 2; `"1k"` is 1000; `"1500m"`,
    negatives, values past int64 and anything that is not a quantity are None.
    """
    found = stored(value)
    if found is None or found.sign < 0:
        return None
    return found.as_int64()


def _json_number(value: float) -> str:
    """The text Go's encoding/json writes for a float64: shortest digits, `e` form below 1e-6 or from 1e21."""
    if not math.isfinite(value):
        raise QuantityError(f"{value!r} is not a quantity")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    negative, digit_tuple, exponent = decimal.Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)  # finite, checked above
    digits = "".join(map(str, digit_tuple)).lstrip("0")
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    sign = "-" if negative else ""
    if 1e-6 <= abs(value) < 1e21:
        if exponent >= 0:
            return sign + stripped + "0" * exponent
        point = len(stripped) + exponent
        if point > 0:
            return f"{sign}{stripped[:point]}.{stripped[point:]}"
        return f"{sign}0.{'0' * -point}{stripped}"
    power = exponent + len(stripped) - 1
    mantissa = stripped[0] + ("." + stripped[1:] if len(stripped) > 1 else "")
    return f"{sign}{mantissa}e{'-' if power < 0 else '+'}{abs(power)}"
