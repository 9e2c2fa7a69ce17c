"""The context stack against a model of the driver's: random programs (hypothesis) and
several threads each running their own sequence."""

import random
import threading

from hypothesis import HealthCheck, given, settings
import pytest
from hypothesis import strategies as st

import cuctx
from cuctx import Context, InvalidContextError

pytestmark = pytest.mark.paths()

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 2)),
        st.tuples(st.just("set_current"), st.integers(0, 2)),
        st.tuples(st.just("pop"), st.just(0)),
        st.tuples(st.just("with"), st.integers(0, 2)),
    ),
    max_size=25,
)


def run_program(contexts, program, model):
    """Apply ``program`` to the real stack and to ``model`` (a list), checking they agree."""
    for op, i in program:
        ctx = contexts[i]
        if op == "push":
            ctx.push()
            model.append(ctx)
        elif op == "set_current":
            ctx.set_current()
            if model:
                model[-1] = ctx
            else:
                model.append(ctx)
        elif op == "pop":
            if model:
                assert Context.pop() is model.pop()
            else:
                try:
                    Context.pop()
                except InvalidContextError:
                    pass
                else:
                    raise AssertionError("popping an empty stack must fail")
        else:  # a with block around a short sub-program that may leave things pushed
            before = list(model)
            with ctx:
                model.append(ctx)
                run_program(contexts, [("push", (i + 1) % 3)], model)
            model[:] = before
        assert cuctx.current_context() is (model[-1] if model else None)


def make_contexts():
    contexts = [Context.create(0), Context.create(0), cuctx.Device(0).primary_context]
    Context.pop()
    Context.pop()
    return contexts


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(program=OPS)
def test_random_programs_match_the_driver_model(backend, program):
    contexts = backend.tls.__dict__.setdefault("model_contexts", None) or make_contexts()
    backend.tls.model_contexts = contexts
    model = []
    try:
        run_program(contexts, program, model)
    finally:
        while model:
            Context.pop()
            model.pop()


def test_threads_keep_their_own_stacks(backend):
    barrier = threading.Barrier(4)
    failures = []

    def worker(seed):
        try:
            rng = random.Random(seed)
            contexts = make_contexts()
            model = []
            for step in range(200):
                op = rng.choice(["push", "push", "pop", "set_current"])
                run_program(contexts, [(op, rng.randrange(3))], model)
                if step % 20 == 0:
                    barrier.wait(timeout=30)  # line the threads up so their calls interleave
            while model:
                assert Context.pop() is model.pop()
            for ctx in contexts[:2]:
                ctx.destroy()
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
            barrier.abort()

    main_ctx = Context.create(0)
    try:
        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        assert cuctx.current_context() is main_ctx  # the main thread's stack is untouched
    finally:
        main_ctx.destroy()
