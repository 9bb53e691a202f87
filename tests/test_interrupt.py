"""rbjax.core.interrupt.interruptible / poll: a long phase stops at the first poll after SIGINT/SIGTERM, with a
message built at that moment; a late signal is not lost; messages of inner phases are kept. (End-to-end: a signal
mid-phase in tests/test_pair_benchmark.py, tests/test_evaluate_dialog.py, tests/test_train_robust.py.)"""
import os
import signal

import pytest

from rbjax.core.interrupt import Interrupted, interruptible, poll


def test_a_phase_stops_at_the_next_poll_and_says_what_it_kept():
    done = []
    with pytest.raises(Interrupted) as ei:
        with interruptible(lambda sig: f"{sig}: kept {done}"):
            for i in range(5):
                done.append(i)  # a finished unit
                if i == 1:
                    os.kill(os.getpid(), signal.SIGTERM)  # (the phase's handler: a flag, not the default kill)
                poll()
    assert str(ei.value) == "SIGTERM: kept [0, 1]" and ei.value.final
    poll()  # outside a phase: nothing
    # a signal after the last poll is honoured when the phase ends
    with pytest.raises(Interrupted, match="^SIGINT: late$"):
        with interruptible(lambda sig: f"{sig}: late"):
            os.kill(os.getpid(), signal.SIGINT)
    # an inner phase's account passes through an outer one; a bare KeyboardInterrupt (or the rbjax command's
    # generic SIGTERM stop) gets the phase's account
    with pytest.raises(Interrupted, match="^inner SIGINT$"):
        with interruptible(lambda sig: f"outer {sig}"):
            with interruptible(lambda sig: f"inner {sig}"):
                os.kill(os.getpid(), signal.SIGINT)
                poll()
    with pytest.raises(Interrupted, match="^phase SIGINT$"):
        with interruptible(lambda sig: f"phase {sig}", defer=False):
            raise KeyboardInterrupt
    with pytest.raises(Interrupted, match="^phase SIGTERM$"):
        with interruptible(lambda sig: f"phase {sig}", defer=False):
            raise Interrupted("rbjax: SIGTERM — stopped", signal_name="SIGTERM", final=False)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
