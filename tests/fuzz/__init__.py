"""The API fuzzer: hypothesis state machines that drive cuctx with random programs and check
them against a NumPy model (tests/test_fuzz.py, tests/test_fuzz_threads.py).

- `kernels`: the tiny kernels launched, with their sim twins and NumPy models.
- `model`: records of the live objects (contexts, streams, events, arrays with their NumPy
  mirrors) and `attempt`, which runs one API call and checks how it may fail.
- `machine`: the single-thread state machine (rules and invariants).
- `run`: the profiles (CI, long), the time budget and the counts printed at the end.
"""
