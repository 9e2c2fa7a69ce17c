"""Tools that watch what the streams do, built on the operation trace (cuctx._trace).

Nothing below this package imports it: each tool is a trace sink (or reads the sim's
activity feed), so it costs nothing while it is off.
"""

from ._racecheck_run import RaceCheck, racecheck
from ._racecheck_shadow import Finding
from ._timeline import Record, Timeline, timeline

__all__ = ["Finding", "RaceCheck", "Record", "Timeline", "racecheck", "timeline"]
