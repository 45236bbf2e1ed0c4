"""quantity: one parser that reads every quantity the way kube-apiserver does.

The tables are ported from Kubernetes' own tests, `k8s.io/apimachinery`
`pkg/api/resource/quantity_test.go` (release v0.34: TestQuantityParse, its invalid list,
TestQuantityString, TestQuantityParseEmit, TestJSONWhitespace, TestParseQuantityString), with the
expected values written as exact (mantissa, power of ten) pairs. The e2e tier
(`tests/e2e/test_quantities.py`) checks the stored forms against a real apiserver.
"""

from __future__ import annotations

import fractions

import hypothesis
import pytest

from policies.gpu import quantity

DSI = quantity.Format.DECIMAL_SI
BSI = quantity.Format.BINARY_SI
DEX = quantity.Format.DECIMAL_EXPONENT
MAX = quantity.INT64_MAX
KI, MI, GI, TI, PI, EI = (1 << 10), (1 << 20), (1 << 30), (1 << 40), (1 << 50), (1 << 60)

# TestQuantityParse: input, (mantissa, power of ten), format.
PARSE_CASES: list[tuple[str, tuple[int, int], quantity.Format]] = [
    ("0", (0, 0), DSI),
    ("0n", (0, 0), DSI),
    ("0u", (0, 0), DSI),
    ("0m", (0, 0), DSI),
    ("0Ki", (0, 0), BSI),
    ("0k", (0, 0), DSI),
    ("0Mi", (0, 0), BSI),
    ("0M", (0, 0), DSI),
    ("0Gi", (0, 0), BSI),
    ("0G", (0, 0), DSI),
    ("0Ti", (0, 0), BSI),
    ("0T", (0, 0), DSI),
    # Quantity less numbers are allowed
    ("1", (1, 0), DSI),
    # Binary suffixes
    ("1Ki", (KI, 0), BSI),
    ("8Ki", (8 * KI, 0), BSI),
    ("7Mi", (7 * MI, 0), BSI),
    ("6Gi", (6 * GI, 0), BSI),
    ("5Ti", (5 * TI, 0), BSI),
    ("4Pi", (4 * PI, 0), BSI),
    ("3Ei", (3 * EI, 0), BSI),
    ("10Ti", (10 * TI, 0), BSI),
    ("100Ti", (100 * TI, 0), BSI),
    # Decimal suffixes
    ("5n", (5, -9), DSI),
    ("4u", (4, -6), DSI),
    ("3m", (3, -3), DSI),
    ("9", (9, 0), DSI),
    ("8k", (8, 3), DSI),
    ("50k", (5, 4), DSI),
    ("7M", (7, 6), DSI),
    ("6G", (6, 9), DSI),
    ("5T", (5, 12), DSI),
    ("40T", (4, 13), DSI),
    ("300T", (3, 14), DSI),
    ("2P", (2, 15), DSI),
    ("1E", (1, 18), DSI),
    # Decimal exponents
    ("1E-3", (1, -3), DEX),
    ("1e3", (1, 3), DEX),
    ("1E6", (1, 6), DEX),
    ("1e9", (1, 9), DEX),
    ("1E12", (1, 12), DEX),
    ("1e15", (1, 15), DEX),
    ("1E18", (1, 18), DEX),
    # Nonstandard but still parsable
    ("1e14", (1, 14), DEX),
    ("1e13", (1, 13), DEX),
    ("100.035k", (100035, 0), DSI),
    # Things that look like floating point
    ("0.001", (1, -3), DSI),
    ("0.0005k", (5, -1), DSI),
    ("0.005", (5, -3), DSI),
    ("0.05", (5, -2), DSI),
    ("0.5", (5, -1), DSI),
    ("0.00050k", (5, -1), DSI),
    ("0.00500", (5, -3), DSI),
    ("0.05000", (5, -2), DSI),
    ("0.50000", (5, -1), DSI),
    ("0.5e0", (5, -1), DEX),
    ("0.5e-1", (5, -2), DEX),
    ("0.5e-2", (5, -3), DEX),
    ("10.035M", (10035, 3), DSI),
    ("1.2e3", (12, 2), DEX),
    ("1.3E+6", (13, 5), DEX),
    ("1.40e9", (14, 8), DEX),
    ("1.53E12", (153, 10), DEX),
    ("1.6e15", (16, 14), DEX),
    ("1.7E18", (17, 17), DEX),
    ("9.01", (901, -2), DSI),
    ("8.1k", (81, 2), DSI),
    ("7.123456M", (7123456, 0), DSI),
    ("6.987654321G", (6987654321, 0), DSI),
    ("5.444T", (5444, 9), DSI),
    ("40.1T", (401, 11), DSI),
    ("300.2T", (3002, 11), DSI),
    ("2.5P", (25, 14), DSI),
    ("1.01E", (101, 16), DSI),
    # Things that saturate/round
    ("3.001n", (4, -9), DSI),
    ("1.1E-9", (2, -9), DEX),
    ("0.0000000001", (1, -9), DSI),
    ("0.0000000005", (1, -9), DSI),
    ("0.00000000050", (1, -9), DSI),
    ("0.5e-9", (1, -9), DEX),
    ("0.9n", (1, -9), DSI),
    ("0.00000012345", (124, -9), DSI),
    ("0.00000012354", (124, -9), DSI),
    ("9Ei", (MAX, 0), BSI),
    ("9223372036854775807Ki", (MAX, 0), BSI),
    ("12E", (12, 18), DSI),
    # We'll accept fractional binary stuff, too.
    ("100.035Ki", (10243584, -2), BSI),
    ("0.5Mi", (MI // 2, 0), BSI),
    ("0.05Gi", (536870912, -1), BSI),
    ("0.025Ti", (274877906944, -1), BSI),
    # Things written by trolls
    ("0.000000000001Ki", (2, -9), DSI),  # rounds up, changes format
    (".001", (1, -3), DSI),
    (".0001k", (100, -3), DSI),
    ("1.", (1, 0), DSI),
    ("1.G", (1, 9), DSI),
]

# ParseQuantity refuses these (the invalid list, plus the spellings of the issue).
INVALID = [
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",
    "1 ",  # the parser itself trims nothing
    "",
    "1kk",
    "K",
    "1K",
    "1KB",
    "--1",
    "+-1",
    "1e",
    "1e+",
    "Non-Numeric",
    "1 k",
    "1_000",
    "0x10",
    "1e99999999999999999999",  # exponent past int64
    ".e-10",
    "Pi",
    "-Ei",  # no digit where Go's arbitrary-precision path needs one
]

# TestQuantityString: (mantissa, power of ten, format) -> canonical text, and an alternate spelling.
STRING_CASES: list[tuple[tuple[int, int, quantity.Format], str, str]] = [
    ((GI, 0, BSI), "1Gi", "1024Mi"),
    ((300 * MI, 0, BSI), "300Mi", "307200Ki"),
    ((6 * KI, 0, BSI), "6Ki", ""),
    ((1001 * GI, 0, BSI), "1001Gi", "1025024Mi"),
    ((TI, 0, BSI), "1Ti", "1024Gi"),
    ((5, 0, BSI), "5", "5000m"),
    ((500, -3, BSI), "500m", "0.5"),
    ((1, 9, DSI), "1G", "1000M"),
    ((1000, 6, DSI), "1G", "0.001T"),
    ((1000000, 3, DSI), "1G", ""),
    ((1000000000, 0, DSI), "1G", ""),
    ((1, -3, DSI), "1m", "1000u"),
    ((80, -3, DSI), "80m", ""),
    ((1080, -3, DSI), "1080m", "1.08"),
    ((108, -2, DSI), "1080m", "1080000000n"),
    ((10800, -4, DSI), "1080m", ""),
    ((300, 6, DSI), "300M", ""),
    ((1, 12, DSI), "1T", ""),
    ((1234567, 6, DSI), "1234567M", ""),
    ((1234567, -3, BSI), "1234567m", ""),
    ((3, 3, DSI), "3k", ""),
    ((1025, 0, BSI), "1025", ""),
    ((0, 0, DSI), "0", ""),
    ((0, 0, BSI), "0", ""),
    ((1, 9, DEX), "1e9", ".001e12"),
    ((1, -3, DEX), "1e-3", "0.001e0"),
    ((1, -9, DEX), "1e-9", "1000e-12"),
    ((80, -3, DEX), "80e-3", ""),
    ((300, 6, DEX), "300e6", ""),
    ((1, 12, DEX), "1e12", ""),
    ((1, 3, DEX), "1e3", ""),
    ((3, 3, DEX), "3e3", ""),
    ((3, 3, DSI), "3k", ""),
    ((0, 0, DEX), "0", "00"),
    ((1, -9, DSI), "1n", ""),
    ((80, -9, DSI), "80n", ""),
    ((1080, -9, DSI), "1080n", ""),
    ((108, -8, DSI), "1080n", ""),
    ((10800, -10, DSI), "1080n", ""),
    ((1, -6, DSI), "1u", ""),
    ((80, -6, DSI), "80u", ""),
    ((1080, -6, DSI), "1080u", ""),
]

# TestQuantityParseEmit.
EMIT_CASES = [
    ("1Ki", "1Ki"),
    ("1Mi", "1Mi"),
    ("1Gi", "1Gi"),
    ("1024Mi", "1Gi"),
    ("1000M", "1G"),
    (".001Ki", "1024m"),
    (".000001Ki", "1024u"),
    (".000000001Ki", "1024n"),
    (".000000000001Ki", "2n"),
]


def exact(mantissa: int, power: int) -> fractions.Fraction:
    return fractions.Fraction(mantissa) * fractions.Fraction(10) ** power


@pytest.mark.parametrize(("text", "value", "form"), PARSE_CASES)
def test_kubernetes_parse_table(text: str, value: tuple[int, int], form: quantity.Format) -> None:
    for sign, prefix in ((1, ""), (-1, "-"), (1, "+")):
        found = quantity.parse(prefix + text)

        assert found.fraction() == sign * exact(*value), prefix + text
        assert found.format is form, prefix + text


@pytest.mark.parametrize("text", INVALID)
def test_kubernetes_invalid_table(text: str) -> None:
    with pytest.raises(quantity.QuantityError):
        quantity.parse(text)


@pytest.mark.parametrize(("amount", "expect", "alternate"), STRING_CASES)
def test_kubernetes_canonical_table(amount: tuple[int, int, quantity.Format], expect: str, alternate: str) -> None:
    mantissa, power, form = amount
    held = quantity.Quantity(unscaled=mantissa, exponent=power, format=form, text="", wide=True)

    assert quantity.canonical(held) == expect
    assert quantity.parse(expect).text == expect  # a canonical string is kept as written
    if mantissa:
        negative = quantity.Quantity(unscaled=-mantissa, exponent=power, format=form, text="", wide=True)
        assert quantity.canonical(negative) == "-" + expect
    if alternate:
        assert quantity.parse(alternate).text == expect


@pytest.mark.parametrize(("text", "expect"), EMIT_CASES)
def test_kubernetes_parse_emit_table(text: str, expect: str) -> None:
    assert quantity.parse(text).text == expect
    assert quantity.parse("-" + text).text == "-" + expect


@pytest.mark.parametrize(
    ("field", "expect"),
    # TestJSONWhitespace: a manifest field is trimmed, numbers are read from their JSON text.
    [(" 1", "1"), ("1 ", "1"), (1, "1"), (10, "10"), (-1, "-1"), (" -1", "-1"), ("\t2\n", "2")],
)
def test_manifest_fields_are_trimmed_like_unmarshal_json(field: str | int, expect: str) -> None:
    assert quantity.decode(field).text == expect


def test_go_whitespace_is_trimmed_but_python_only_whitespace_is_not() -> None:
    assert quantity.count("\u00a02\u3000") == 2
    assert quantity.count("\x1c2") is None  # str.strip() would trim it; Go's TrimSpace does not


@pytest.mark.parametrize(
    ("text", "value", "kept"),
    # The rows of the issue, and the spellings the e2e tier sends through a real apiserver.
    [
        ("+2", 2, "+2"),
        ("1k", 1000, "1k"),
        ("2000m", 2, "2"),
        ("1Ki", 1024, "1Ki"),
        ("1e3", 1000, "1e3"),
        ("2e0", 2, "2e0"),
        ("0.002k", 2, "2"),
        ("1000", 1000, "1k"),
        ("1.500k", 1500, "1.500k"),
        ("01", 1, "01"),
        ("1.5Gi", 1610612736, "1536Mi"),
        ("1024Ki", 1048576, "1Mi"),
        ("0", 0, "0"),
        ("-0", 0, "0"),
        (".", 0, "0"),
        ("-", 0, "0"),
        ("k", 0, "0"),
    ],
)
def test_odd_spellings_are_read_as_the_apiserver_reads_and_stores_them(text: str, value: int, kept: str) -> None:
    found = quantity.parse(text)

    assert found.fraction() == value
    assert found.text == kept
    assert quantity.count(text) == value


@pytest.mark.parametrize(
    "text", ["0.5", "1500m", "1.1", "1n", "-1", "-2000m", "12E", "9.3E", "x", "1kk", "", True, [1], {"a": 1}]
)
def test_count_is_none_for_what_is_not_a_whole_non_negative_int64(text: object) -> None:
    assert quantity.count(text) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (2, 2),
        (2.0, 2),
        (1e3, 1000),
        (0.5, fractions.Fraction(1, 2)),
        (1e21, 10**21),
        (1e-7, fractions.Fraction(1, 10**7)),
        (None, 0),
    ],
)
def test_numbers_and_null_decode_as_the_apiserver_decodes_their_json(
    field: float | None, value: int | fractions.Fraction
) -> None:
    assert quantity.decode(field).fraction() == value


def test_json_numbers_are_written_as_go_writes_them() -> None:
    assert quantity.decode(1e21).text == "1e+21"
    assert quantity.decode(1.5).text == "1500m"
    assert quantity.decode(123456789.125).text == "123456789.125"


def test_exponents_wrap_at_32_bits_as_in_go() -> None:
    assert quantity.parse("1e4294967296").fraction() == 1
    assert quantity.parse("1e4294967299").fraction() == 1000
    # Go holds 1000e2147483647 as 1000 x 10^2147483647 and writes 1e-2147483646 (the exponent
    # wrapped); what the cluster then reads back is one nano.
    assert quantity.parse("1000e2147483647").text == "1e-2147483646"
    stored = quantity.stored("1000e2147483647")
    assert stored is not None and stored.fraction() == fractions.Fraction(1, 10**9)


def test_go_1_34_drops_an_exponent_it_has_no_suffix_for() -> None:
    assert quantity.parse("1000E").text == "1"
    assert quantity.parse("1000E").fraction() == 10**21
    assert quantity.count("1000E") == 1  # what the cluster stores and reads back


def test_decimal_values_are_not_capped_but_binary_ones_are() -> None:
    assert quantity.parse("18446744073709551616").fraction() == 2**64
    assert quantity.parse("16Ei").fraction() == MAX
    assert quantity.parse("-16Ei").fraction() == -MAX


def test_huge_exponents_cost_nothing() -> None:
    found = quantity.parse("1e2147483647")

    assert found.text == "10e2147483646"  # exponent lowered to a multiple of three, as Go writes it
    assert found.as_int64() is None
    assert found.is_integer()
    with pytest.raises(OverflowError):
        found.fraction()


def test_too_many_digits_are_refused_rather_than_crashing() -> None:
    with pytest.raises(quantity.QuantityError):
        quantity.parse("0." + "1" * 5000)
    assert quantity.count("1" * 5000) is None


def test_same_value_compares_values_not_spellings() -> None:
    assert quantity.parse("2000m").same_value(quantity.parse("+2"))
    assert quantity.parse("1k").same_value(quantity.parse("1e3"))
    assert not quantity.parse("1Ki").same_value(quantity.parse("1k"))
    assert quantity.parse("0").same_value(quantity.parse("0Ki"))


@pytest.mark.parametrize(
    ("text", "milli", "valid"),
    [
        ("2", 2000, True),
        ("1500m", 1500, False),
        ("1n", 1, False),  # rounded up to a whole milli
        ("9223372036854775", 9223372036854775000, True),  # the largest exact one
        ("9223372036854776", -9223372036854775616, False),  # int64 wrap: not a multiple of 1000
        ("999999999999999999", 3875820019684211736, False),
        ("1000E", 0, True),  # Go's overflow loop reads 0: accepted (and written back as "1")
        ("1e19", 0, True),
        ("1000000000000000000000", 2003764205206896640, False),  # arbitrary precision, low 64 bits
        ("16Ei", -1000, True),  # capped at 2^63-1, times 1000, wrapped
        ("-2", -2000, False),
    ],
)
def test_milli_value_and_the_apiservers_integer_check_replay_go(text: str, milli: int, valid: bool) -> None:
    found = quantity.parse(text)

    assert quantity.milli_value(found) == milli
    assert quantity.passes_integer_validation(found) is valid


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(hypothesis.strategies.text(alphabet="0123456789.+-eEinumkKMGTP \t", max_size=14))
def test_any_text_parses_or_is_refused_and_the_written_form_is_a_fixed_point(text: str) -> None:
    try:
        found = quantity.parse(text)
    except quantity.QuantityError:
        if text == text.strip(" \t"):  # nothing for decode to trim: the manifest field is refused too
            assert quantity.count(text) is None
        return
    written = quantity.parse(found.text)
    assert quantity.parse(written.text).text == written.text
    quantity.milli_value(found)  # never raises


@pytest.mark.parametrize(
    "value", ["3", "2000m", " 2 ", "1500m", "-0", "1e19", "1000E", "x", "", 2, 2.0, -0.0, True, None, {}, []]
)
def test_stored_answers_the_same_from_its_cache(value: object) -> None:
    # Text values are cached (frozen results shared between reviews); the answer stays the uncached one.
    first, again = quantity.stored(value), quantity.stored(value)
    assert first == again == quantity._stored(value)
    if isinstance(first, quantity.Quantity):
        assert isinstance(again, quantity.Quantity)  # equal to first, as asserted above
        assert (first.unscaled, first.exponent, first.format, first.text) == (
            again.unscaled,
            again.exponent,
            again.format,
            again.text,
        )
