"""The engine process's pipe: the step outputs it sends are what the streams get."""

from __future__ import annotations

import multiprocessing

from accel.contract import KVTransferParams, TokenLogprob
from accel.tt.core_messages import NewTokens, RequestFailed
from accel.tt.engine_process import ProcessStep, outputs_from_wire, outputs_to_wire


def test_step_outputs_cross_a_real_pipe_unchanged_and_in_order():
    outputs = [
        NewTokens("a", (5,), None, 32),
        NewTokens("b", (7, 8), (TokenLogprob(7, -0.5, ((7, -0.5), (3, -1.25)), 1), TokenLogprob(8, -0.1)), 0),
        RequestFailed("c", ValueError("bad grammar")),
        NewTokens("d", (), None, 64, is_aborted=True),
        NewTokens("e", (9,), None, 0, kv_transfer=KVTransferParams(do_remote_decode=True, transfer_id="t-1")),
    ]
    wire = outputs_to_wire(outputs)
    assert [type(w) for w in wire] == [tuple, tuple, RequestFailed, tuple, tuple]  # NewTokens as plain tuples

    parent, child = multiprocessing.Pipe()
    try:
        child.send(
            ProcessStep(wire, stats=None, extra_stats=None, kv_events=[], num_busy_iterations=3, host_busy_s=0.5)
        )  # type: ignore[arg-type]
        received = parent.recv()
    finally:
        parent.close()
        child.close()
    back = outputs_from_wire(received.outputs)

    assert [type(m) for m in back] == [NewTokens, NewTokens, RequestFailed, NewTokens, NewTokens]
    news = [m for m in back if isinstance(m, NewTokens)]
    assert news == [m for m in outputs if isinstance(m, NewTokens)]
    assert news[1].logprobs is not None and news[1].logprobs[0].top == ((7, -0.5), (3, -1.25))
    assert news[2].is_aborted and news[2].token_ids == ()
    assert news[3].kv_transfer == KVTransferParams(do_remote_decode=True, transfer_id="t-1")
    failed = back[2]
    assert isinstance(failed, RequestFailed) and failed.req_id == "c" and str(failed.error) == "bad grammar"
