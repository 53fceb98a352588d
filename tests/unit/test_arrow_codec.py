import numpy as np
import pyarrow as pa
import pytest

from sparkdl.errors import CodecError
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays, encode_buffer, encoded_views


def _bits(a):
    return np.asarray(a).tobytes()


@pytest.mark.parametrize(
    "array",
    [
        np.array([[1.5, -0.0], [np.nan, np.inf]], dtype=np.float32),
        np.array([1e-8, 65504.0, -0.0, np.nan], dtype=np.float16),
        np.array([-(2**63), 2**63 - 1, 0], dtype=np.int64),
        np.array(7, dtype=np.int64),  # 0-d, like Adam's iteration counter
        np.array(0.001, dtype=np.float32),  # 0-d learning rate
        np.array([True, False, True]),
        np.zeros((0, 3), dtype=np.float32),
        np.arange(24, dtype=np.float64).reshape(2, 3, 4),
    ],
)
def test_round_trip_is_bit_exact(array):
    decoded = decode_arrays(encode_arrays([array], ["layer/kernel"]))
    assert decoded.names == ["layer/kernel"]
    (out,) = decoded.arrays
    assert out.dtype == array.dtype
    assert out.shape == array.shape
    assert _bits(out) == _bits(array)


def test_many_arrays_keep_order_and_names():
    arrays = [np.full((2,), i, dtype=np.float32) for i in range(5)]
    decoded = decode_arrays(encode_arrays(arrays, [f"v{i}" for i in range(5)]))
    assert decoded.names == [f"v{i}" for i in range(5)]
    assert [float(a[0]) for a in decoded.arrays] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_non_contiguous_input_is_encoded_in_logical_order():
    a = np.arange(6, dtype=np.float32).reshape(2, 3).T
    (out,) = decode_arrays(encode_arrays([a])).arrays
    np.testing.assert_array_equal(out, a)


def test_payload_is_arrow_ipc_with_version_in_schema():
    payload = encode_arrays([np.zeros(3, np.float32)], ["w"])
    with pa.ipc.open_stream(payload) as reader:
        assert reader.schema.metadata[b"sparkdl.format"] == b"1"
        assert reader.schema.field(0).metadata[b"shape"] == b"[3]"


def test_garbage_and_pickle_payloads_are_rejected():
    import pickle

    with pytest.raises(CodecError, match="Arrow IPC"):
        decode_arrays(pickle.dumps([np.zeros(2)]))
    with pytest.raises(CodecError, match="Arrow IPC"):
        decode_arrays(b"")


def test_other_format_version_is_rejected():
    schema = pa.schema([pa.field("0", pa.large_list(pa.float32()))], metadata={"sparkdl.format": "99", "sparkdl.kind": "arrays"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays([pa.array([[1.0]], pa.large_list(pa.float32()))], schema=schema))
    with pytest.raises(CodecError, match="format 1. Received format '99'"):
        decode_arrays(sink.getvalue().to_pybytes())


def test_object_dtype_and_length_mismatch_are_rejected():
    with pytest.raises(CodecError, match="numeric or bool dtype"):
        encode_arrays([np.array(["a"], dtype=object)])
    with pytest.raises(CodecError, match="same length"):
        encode_arrays([np.zeros(1)], ["a", "b"])


def test_decode_without_copy_gives_equal_read_only_views():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, np.int64), np.array([True, False])]
    payload = encode_arrays(arrays)
    views = decode_arrays(payload, copy=False).arrays
    for original, view in zip(arrays, views, strict=True):
        np.testing.assert_array_equal(original, view)
        assert view.dtype == original.dtype and view.shape == original.shape
    assert not views[0].flags.writeable  # a view of the payload's memory, not a copy
    assert decode_arrays(payload).arrays[0].flags.writeable


def test_encode_buffer_is_the_payload_in_a_bytearray_that_outlives_its_arrays():
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array(7, np.int64), np.array([True, False])]
    buffer = encode_buffer(arrays, ["w", "step", "mask"])
    expected = [a.copy() for a in arrays]
    del arrays  # the buffer holds its own copy of the values
    assert isinstance(buffer, bytearray) and bytes(buffer) == encode_arrays(expected, ["w", "step", "mask"])
    views = encoded_views(bytes(buffer))
    assert views.names == ["w", "step", "mask"]
    for got, want in zip(views, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
