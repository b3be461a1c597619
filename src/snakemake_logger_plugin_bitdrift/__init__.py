"""Quiet progress for Snakemake runs of bitdrift (`--logger bitdrift`, the local profile's
default): one line per finished job with jobs done/total and the elapsed time; errors and
warnings in full, as Snakemake prints them; dry runs as Snakemake prints them. Snakemake's
full output is one flag away (`--logger-bitdrift-full`) and always in its own log file
(`.snakemake/log/`, named at the end of the run). A `--configfile` that is not there is one
line (missing_config_file), not Snakemake's traceback.

A job that runs longer than `--logger-bitdrift-progress-every` seconds (60) gets a line
saying where it is: the latest progress line in its log (bitdrift.progress: what tqdm
counted, k of n), again at most once per as many seconds while that changes.

Snakemake finds logger plugins by module name (`snakemake_logger_plugin_*`); this one ships
inside the bitdrift distribution.
"""

# No `from __future__ import annotations`: the settings' field types must be real types
# (Snakemake builds its command-line flags from them)
import ast
import logging
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent
from snakemake_interface_logger_plugins.settings import LogHandlerSettingsBase

# Snakemake's plain messages worth a line in the quiet view (the rest is its chatter)
KEPT_MESSAGES = ("Nothing to be done", "Complete log", "Will exit after finishing")
# What Snakemake reads as a config file (JSON or YAML); another word after --configfile is
# taken for a target written in the wrong place
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class LogHandlerSettings(LogHandlerSettingsBase):
    full: bool = field(default=False, metadata={
        "help": "print Snakemake's full output (every job's block) instead of one line per "
                "finished job"})
    progress_every: int = field(default=60, metadata={
        "help": "seconds a job runs before a line says where it is (its latest progress: "
                "stage, k of n), then at most once per as many seconds while it changes; "
                "0: never"})


def missing_config_file(record: logging.LogRecord) -> str | None:
    """One line for a `--configfile` that does not exist, or None for any other record.
    Snakemake reads its config files before the Snakefile (cli.args_to_api builds
    ConfigSettings, whose load_configfile opens each one), so neither the Snakefile nor
    bitdrift.config sees this mistake, and Snakemake reports it as its own traceback. The
    usual cause is a target written after `--configfile`, which takes every later word as
    a file; the handler sees the error by its class (print_exception's `exception`) and the
    frame that raised it."""
    message = str(record.msg or "")
    if getattr(record, "exception", None) != "FileNotFoundError" or \
            "load_configfile" not in message:
        return None
    # The last line is Python's own: `FileNotFoundError: [Errno 2] No such file or
    # directory: 'all'`, the name as its repr
    name = re.search(r"No such file or directory: ('.*'|\".*\")\s*$", message)
    file = ast.literal_eval(name.group(1)) if name else "?"
    where = f"bitdrift: config file {file!r} does not exist (in {os.getcwd()})"
    if file.endswith(CONFIG_SUFFIXES):
        return f"{where}; check its path (the presets are in config/presets/)"
    return (f"{where}: --configfile takes every word after it as a config file, so put "
            "targets first: snakemake --profile profiles/local all --configfile mine.yaml")


def job_label(rule: str, wildcards) -> str:
    """`rule (key=value, ...)`: what a finished job was, in one line."""
    if not wildcards:
        return rule
    items = wildcards.items() if hasattr(wildcards, "items") else []
    text = ", ".join(f"{key}={value}" for key, value in items)
    return f"{rule} ({text})" if text else rule


def elapsed(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes:2d}:{seconds:02d}"


def counter(done: int, total, since_start: float) -> str:
    """`[done/total elapsed]`, the quiet view's lines' start."""
    width = len(str(total))
    return f"[{done:>{width}}/{total} {elapsed(since_start)}]"


def running_line(label: str, running_seconds: float, state: str | None,
                 log: str | None) -> str:
    """What a running job is doing: its latest progress (bitdrift.progress.latest_progress),
    or its log's name where it has counted nothing yet."""
    ran = elapsed(running_seconds).strip()
    if state is None:
        return f"running {label} for {ran}: nothing counted yet" + (f" (log: {log})"
                                                                    if log else "")
    return f"running {label} for {ran}: {state}"


@dataclass
class RunningJob:
    label: str
    log: str | None
    started: float  # time.monotonic()
    shown: str | None = None  # the state last shown, "" for "nothing counted"
    shown_at: float | None = None


class LogHandler(LogHandlerBase):
    def __post_init__(self) -> None:
        from snakemake.logging import DefaultFilter, DefaultFormatter

        settings = self.common_settings
        self.snakemake_filter = DefaultFilter(settings.quiet, settings.debug_dag,
                                              settings.verbose, settings.dryrun,
                                              settings.printshellcmds)
        self.snakemake_format = DefaultFormatter(settings.quiet, settings.show_failed_logs)
        self.full = bool(self.settings and self.settings.full) or settings.dryrun
        self.stream = sys.stdout if getattr(settings, "stdout", False) else sys.stderr
        self.started = time.monotonic()
        self.labels: dict[int, str] = {}
        self.finished: list[int] = []
        self.done, self.total = 0, None
        self.every = 0 if self.full else int(getattr(self.settings, "progress_every", 60) or 0)
        self.running: dict[int, RunningJob] = {}
        self.lock = threading.RLock()  # the watcher thread writes too
        self.stop = threading.Event()
        self.watcher = None

    def write(self, text: str) -> None:
        if text:
            with self.lock:
                self.stream.write(text.rstrip("\n") + "\n")
                self.stream.flush()

    def watch(self) -> None:
        """Every few seconds: a line for each job running longer than ``every`` whose
        latest progress changed since its last line, that line ``every`` ago or more."""
        from bitdrift.progress import latest_progress

        while not self.stop.wait(max(0.2, min(5.0, self.every / 4))):
            now = time.monotonic()
            with self.lock:
                jobs = list(self.running.items())
            for jobid, job in jobs:
                if now - job.started < self.every or (
                        job.shown_at is not None and now - job.shown_at < self.every):
                    continue
                state = latest_progress(job.log) if job.log else None
                if (state or "") == job.shown:
                    continue
                with self.lock:
                    if self.running.get(jobid) is not job:
                        continue  # it ended meanwhile
                    job.shown, job.shown_at = state or "", now
                    self.write(f"{counter(self.done, self.total or '?', now - self.started)} "
                               f"{running_line(job.label, now - job.started, state, job.log)}")

    def close(self) -> None:
        self.stop.set()
        super().close()

    def write_as_snakemake(self, record: logging.LogRecord) -> None:
        if self.snakemake_filter.filter(record):
            self.write(self.snakemake_format.format(record))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.handle_record(record)
        except Exception:  # a logger must never stop the run
            self.handleError(record)

    def handle_record(self, record: logging.LogRecord) -> None:
        config_mistake = missing_config_file(record)
        if config_mistake and not (self.settings and self.settings.full):
            self.write(config_mistake)  # also in a dry run, whose view is otherwise full
            return
        if self.full:
            self.write_as_snakemake(record)
            return
        event = getattr(record, "event", None)
        if event == LogEvent.JOB_INFO:
            self.labels[record.jobid] = job_label(record.rule_name, record.wildcards)
            self.job_started(record)
        elif event == LogEvent.JOB_FINISHED:
            self.finished.append(record.job_id)
            with self.lock:
                self.running.pop(record.job_id, None)
        elif event == LogEvent.PROGRESS:
            self.done, self.total = record.done, record.total
            for job in self.finished:
                self.write(f"{counter(record.done, record.total, time.monotonic() - self.started)}"
                           f" done {self.labels.pop(job, f'job {job}')}")
            self.finished.clear()
        elif event == LogEvent.RUN_INFO:
            total = next((line.split()[-1] for line in str(record.msg or "").splitlines()
                          if line.strip().startswith("total")), None)
            if total:
                self.total = total
                where = (f", and where a job running over {self.every} s is"
                         if self.every else "")
                self.write(f"bitdrift: {total} jobs to run; one line per finished job{where} "
                           "(Snakemake's full output: add --logger-bitdrift-full)")
        elif record.levelno >= logging.WARNING or event in (
                LogEvent.ERROR, LogEvent.JOB_ERROR, LogEvent.GROUP_ERROR):
            if event == LogEvent.JOB_ERROR:
                with self.lock:
                    self.running.pop(getattr(record, "jobid", None), None)
            # Every warning and error in full, whatever its event: a lock left by a killed
            # run, a failed report, a missing input or a config that does not parse is the
            # reason the run stops, and the quiet view must say it
            self.write(self.snakemake_format.format(record))
        elif event is None and str(record.msg or "").startswith(KEPT_MESSAGES):
            self.write(self.snakemake_format.format(record))

    def job_started(self, record: logging.LogRecord) -> None:
        """A job Snakemake starts (its JOB_INFO): watched from now on, the watcher started
        with the first one."""
        if not self.every:
            return
        logs = [str(path) for path in getattr(record, "log", None) or []]
        with self.lock:
            self.running[record.jobid] = RunningJob(self.labels[record.jobid],
                                                    logs[0] if logs else None,
                                                    time.monotonic())
            if self.watcher is None:
                self.watcher = threading.Thread(target=self.watch, name="bitdrift-progress",
                                                daemon=True)
                self.watcher.start()

    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False
