"""Short programs written with cuctx; `python -m cuctx demo` runs them and says what each shows.

Each is also a script: ``python -m cuctx.examples.<name>`` runs one on its own (with the full
traceback, should it fail).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    name: str  # the module in cuctx.examples: what `python -m cuctx demo NAME` takes
    title: str  # what it shows, in a few words
    shows: str  # one sentence: what the program does
    look_at: str  # one sentence: what to look at in its output


EXAMPLES: dict[str, Example] = {
    e.name: e
    for e in (
        Example(
            "context_stack",
            "the context stack walk",
            "Two contexts created on one device, pushed and popped on the thread's context stack, "
            "then destroyed, and the device's primary context made current for a block.",
            "each `current =` line names the top of the stack; after both contexts are destroyed "
            "none is left current; using a destroyed one is a ContextDestroyedError, not a crash.",
        ),
        Example(
            "context_independent",
            "one library, any context",
            "One kernel library loaded once, before any context exists, and the same kernel "
            "handle launched in every device's primary context and in a context created later.",
            "every context prints [0.0, 2.0, 4.0, 6.0], and the launch count kept in managed "
            "memory equals the number of contexts.",
        ),
        Example(
            "stream_overlap",
            "copy/compute/copy on four streams",
            "An array cut in four chunks, each copied in, scaled by a kernel and copied back on "
            "its own stream so that the streams overlap; then a read on a second stream that "
            "forgets to wait for the kernel.",
            "the four-stream result is correct; the sum read without the wait is stale (every time "
            "on the simulated GPU, now and then on a real one) and 1.0000 with the wait.",
        ),
        Example(
            "decoding_loop",
            "AutoGraph on a token-by-token decoding loop",
            "A token loop of a few dozen small kernels per token, whose sequence length changes "
            "every token and whose structure changes every 64 tokens, run eagerly and with "
            "@cuctx.autograph on the same inputs.",
            "the outputs are equal; almost every call is patched (the nodes that take the "
            "sequence length, then the graph launched), each new structure runs eagerly at its "
            "first call and builds its graph at its second (a graph of these kernels pays at "
            "once, and the first structure lasted 64 calls), each such call with its reason, the "
            "same on every run of the sim; a GPU also prints the time per token of both.",
        ),
        Example(
            "contexts_on_one_gpu",
            "streams and contexts on one GPU, on a timeline",
            "The same long kernels recorded with cuctx.timeline() on two streams of one context "
            "(with copies in and out), in two contexts on one device, and in two green contexts "
            "that split the device's SMs, each written as a Chrome trace and, with matplotlib, a "
            "picture.",
            "the copy/compute overlap of the two streams is above zero, two contexts run kernels "
            "at once for 0.000 ms (they take turns) while green contexts do (side by side); open "
            "the .json files named at the end in https://ui.perfetto.dev.",
        ),
        Example(
            "isolated_kernel_evaluation",
            "a faulting or hanging kernel costs a worker, not the program",
            "Six candidate kernels evaluated in a cuctx.IsolatedExecutor worker with a warm "
            "standby, writing into the caller's arrays of an IPC memory pool: two write out of "
            "bounds, one never finishes, one computes the wrong thing.",
            "the table: each fault is a WorkerFaultError and the hang a WorkerTimeoutError, "
            "the next call is served by a new worker a moment later (its time in the last "
            "column), and the program and its own arrays carry on.",
        ),
    )
}
