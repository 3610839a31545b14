"""The pure parts of `ascendra chaos` (bench/chaos/chaos_run.py): how answers are told apart, what
it sends as garbage, and the printed tally. The full run is in tests/test_daemon_faults.py.

Covers: bench/chaos/chaos_run.py.
"""
from __future__ import annotations

from bench.chaos.chaos_run import Tally, format_tally
from bench.chaos.chaos_client import Answer, record_error
from bench.chaos.garbage_frames import garbage_frames
from ipc.codec import controller_decoder
from ipc.messages import StepOutputs


def test_http_errors_with_a_reason_are_drops_and_the_rest_errors():
    answer = Answer(0, 10, None)
    record_error(answer, {"message": "overloaded", "code": "queue_full"}, "HTTP 503")
    assert (answer.outcome, answer.reason) == ("dropped", "queue_full")
    answer = Answer(1, 10, None)
    record_error(answer, {"message": "instance 2 stopped (exit code -9) ...", "code": "instance_failed"},
           "HTTP 503")
    assert answer.outcome == "errored" and answer.reason.startswith("HTTP 503: instance N stopped")
    # An SSE error ends a stream that had started: an error whatever its code.
    answer = Answer(2, 10, None)
    record_error(answer, {"message": "the server is shutting down", "code": "shutting_down"}, "SSE")
    assert answer.outcome == "errored"


def test_every_garbage_message_is_refused_by_the_controller_or_its_identity_check():
    decoder = controller_decoder()
    single = [m[0] for m in garbage_frames() if len(m) == 1]
    assert len(single) < len(garbage_frames())  # and one multi-frame message
    decoded = [decoder.decode(frame) for frame in single]
    # The one well-formed message claims to be instance 0: the channel drops it, because it
    # comes from an identity that is no instance's (tests/test_ipc.py tests that check).
    assert [type(m) for m in decoded if m is not None] == [StepOutputs]
    assert decoder.num_bad_frames == len(single) - 1


def test_the_tally_says_ok_only_when_nothing_was_lost():
    tally = Tally(sent=5, accepted=5, completed=3, dropped={"queue_full": 1}, cancelled=1,
                  daemon_exit_code=0)
    text = format_tally(tally)
    assert tally.ok and "lost              0" in text and "queue_full 1" in text
    assert text.rstrip().endswith("OK")
    tally.lost, tally.lost_examples = 1, ["request 4 (sent at 1.00 s, 3 tokens): no answer"]
    assert not tally.ok and "FAILED" in format_tally(tally) and "request 4" in format_tally(tally)
    assert not Tally(daemon_exit_code=1).ok and not Tally(daemon_exit_code=0, orphans=1).ok
