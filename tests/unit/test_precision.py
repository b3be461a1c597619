import numpy as np
import pytest

from bitdrift.analysis.remaining_precision import (
    MANTISSA_BITS,
    bit_length,
    integer_view,
    pairwise_dropped_bits,
    remaining_precision,
)


def next_up(value, dtype, steps=1):
    bits = np.array([value], dtype=dtype).view(integer_view(np.array([value], dtype=dtype),
                                                            np.dtype(dtype).name).dtype)
    return (bits + steps).view(dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_identical_outputs_keep_all_mantissa_bits(dtype):
    x = np.linspace(-3, 3, 50).astype(dtype)
    result = remaining_precision([x, x.copy(), x.copy()])
    assert result["remaining_precision"] == MANTISSA_BITS[dtype]
    assert result["remaining_precision_uncapped"] == MANTISSA_BITS[dtype]
    assert result["deviating_fraction"] == 0.0


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_last_bit_difference_costs_one_bit(dtype):
    x = np.array([1.5, 2.25, 3.0], dtype=dtype)
    y = x.copy()
    y[1] = next_up(x[1], dtype)[0]  # mantissa ...00 -> ...01
    result = remaining_precision([x, y])
    assert result["remaining_precision"] == MANTISSA_BITS[dtype] - 1
    assert result["deviating_fraction"] == pytest.approx(1 / 3)
    # the two untouched elements keep everything, so the median is m
    assert result["median_remaining_precision"] == MANTISSA_BITS[dtype]


def test_carry_into_higher_bits_counts_the_highest_changed_bit():
    x = np.array([1.0 + 2.0**-23 * 3], dtype=np.float32)  # mantissa ...011
    y = next_up(x[0], np.float32)  # ...100: bits 0,1,2 changed
    assert remaining_precision([x, y])["remaining_precision"] == 23 - 3


def test_exponent_difference_gives_zero_and_negative_uncapped():
    x = np.array([2.0], dtype=np.float32)
    y = np.array([4.0], dtype=np.float32)  # only the lowest exponent bit (bit 23) differs
    result = remaining_precision([x, y])
    assert result["remaining_precision"] == 0
    assert result["remaining_precision_uncapped"] == 23 - 24


def test_sign_difference_and_negative_zero():
    pos, neg = np.array([0.0], np.float32), np.array([-0.0], np.float32)
    result = remaining_precision([pos, neg])
    assert result["remaining_precision"] == 0
    assert result["remaining_precision_uncapped"] == 23 - 32
    assert result["deviating_fraction"] == 1.0


def test_nan_with_same_bits_agrees_and_with_other_payload_differs():
    nan = np.array([np.nan], np.float32)
    assert remaining_precision([nan, nan.copy()])["remaining_precision"] == 23
    other = (nan.view(np.uint32) | np.uint32(1)).view(np.float32)
    assert np.isnan(other[0])
    assert remaining_precision([nan, other])["remaining_precision"] == 22


def test_bfloat16_raw_bits():
    x = np.array([0x3F80, 0x4000], dtype=np.uint16)  # 1.0, 2.0 in bfloat16
    y = np.array([0x3F81, 0x4000], dtype=np.uint16)
    assert remaining_precision([x, y], "bfloat16")["remaining_precision"] == 6


def test_bit_length_is_exact_for_64_bit_words():
    values = np.array([0, 1, 2, 3, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63, 2**64 - 1],
                      dtype=np.uint64)
    expected = [int(v).bit_length() for v in values]
    assert bit_length(values).tolist() == expected


def naive_remaining_precision(outputs, m, total_bits, view):
    """Pairs and shifts: the definition taken literally."""
    ints = [o.view(view).astype(object) for o in outputs]
    for dropped in range(total_bits + 1):
        if all((a >> dropped == b >> dropped).all() for a in ints for b in ints):
            return m - dropped
    raise AssertionError


@pytest.mark.parametrize("dtype,view,total", [("float32", np.uint32, 32),
                                              ("float64", np.uint64, 64)])
def test_matches_naive_definition_on_random_perturbations(dtype, view, total):
    rng = np.random.default_rng(0)
    for _ in range(30):
        base = rng.normal(size=20).astype(dtype)
        outputs = [base]
        for _ in range(rng.integers(1, 5)):
            noise = rng.integers(0, 2 ** int(rng.integers(0, 30)), size=20)
            outputs.append((base.view(view) ^ noise.astype(view)).view(dtype))
        expected = naive_remaining_precision(outputs, MANTISSA_BITS[dtype], total, view)
        result = remaining_precision(outputs)
        assert result["remaining_precision_uncapped"] == expected
        assert result["remaining_precision"] == min(max(expected, 0), MANTISSA_BITS[dtype])


def test_pairwise_matrix_max_equals_set_value():
    rng = np.random.default_rng(1)
    base = rng.normal(size=10).astype(np.float32)
    outputs = [base, (base.view(np.uint32) ^ np.uint32(4)).view(np.float32),
               (base.view(np.uint32) ^ np.uint32(1)).view(np.float32)]
    matrix = pairwise_dropped_bits(outputs, "float32")
    assert matrix[0, 1] == 3 and matrix[0, 2] == 1 and matrix[1, 2] == 3
    assert 23 - matrix.max() == remaining_precision(outputs)["remaining_precision"]


# -- statistical significant bits (significantdigits, CNH) -------------------------------
def _cnh_by_hand(values, reference):
    """Sohier et al.'s CNH bound for relative errors Z = X / Y - 1 over n samples:
    s = -log2(sd(Z)) - [1/2 log2((n-1) / chi2_{alpha/2, n-1}) + log2(Phi^-1((p+1)/2))],
    sd with ddof 0, p = confidence = 0.95 (the package's defaults)."""
    from scipy import stats

    z = np.asarray(values, dtype=np.float64) / reference - 1
    n = len(z)
    chi2 = stats.chi2.ppf(0.025, n - 1)
    delta = 0.5 * np.log2((n - 1) / chi2) + np.log2(stats.norm.ppf(0.975))
    return -np.log2(np.std(z)) - delta


def test_significant_bits_match_a_hand_computed_cnh_example():
    from bitdrift.analysis.remaining_precision import significant_bits

    column = np.array([1.0, 1.0 + 2.0**-20, 1.0 - 2.0**-21, 1.0 + 2.0**-22])
    outputs = column[:, None]
    expected = _cnh_by_hand(column, 1.0)
    assert 10 < expected < 23  # a meaningful, uncapped case
    result = significant_bits(outputs, "float32", reference=np.array([1.0]))
    assert result["significant_bits_mean"] == pytest.approx(expected, abs=1e-9)
    assert result["significant_bits_min"] == pytest.approx(expected, abs=1e-9)
    # Against the devices' mean instead of a reference
    mean = significant_bits(outputs, "float32")
    assert mean["significant_bits_mean"] == pytest.approx(_cnh_by_hand(column, column.mean()),
                                                          abs=1e-9)


@pytest.mark.parametrize("float_format", ["float16", "float32", "float64"])
def test_significant_bits_of_agreeing_devices_are_the_full_mantissa(float_format):
    from bitdrift.analysis.remaining_precision import significant_bits

    x = np.linspace(-3, 3, 20).astype(float_format).astype(np.float64)
    outputs = np.stack([x, x.copy(), x.copy()])
    result = significant_bits(outputs, float_format)
    assert result == {"significant_bits_mean": MANTISSA_BITS[float_format],
                      "significant_bits_min": MANTISSA_BITS[float_format]}
    # One element apart: the minimum drops, the other 19 keep the full mantissa
    outputs[1, 3] = x[3] * (1 + 2.0 ** -(MANTISSA_BITS[float_format] - 3))
    apart = significant_bits(outputs, float_format)
    assert apart["significant_bits_min"] < MANTISSA_BITS[float_format]
    assert apart["significant_bits_mean"] > apart["significant_bits_min"]


def test_precision_table_reports_significant_bits_against_the_float64_device(make_record):
    from bitdrift.analysis.eqc import precision_table
    from bitdrift.record.reader import open_records

    base = np.linspace(0.5, 2.0, 8)
    reference = make_record("d64", {0: base[None, None, :]}, precision="float64")
    first = make_record("a", {0: base.astype(np.float32)[None, None, :]})
    nudged = base.astype(np.float32)
    nudged[2] = next_up(nudged[2], np.float32, 3)[0]
    second = make_record("b", {0: nudged[None, None, :]})
    records = open_records([first, second, reference])
    table = precision_table(records, precision="float32", significant=True)
    row = table.iloc[0]
    assert row["significant_bits_reference"] == "float64 device d64"
    assert row["significant_bits_min"] < 23 and row["remaining_precision"] < 23
    assert row["significant_bits_mean"] > row["significant_bits_min"]  # 7 of 8 agree
    plain = precision_table(records, precision="float32")
    assert plain["significant_bits_mean"].isna().all()
