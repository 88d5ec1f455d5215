"""One root for user mistakes, one handler for every entry point."""
import pytest

from common import ConfigError, UserError, report_user_errors
from common.registry import Registry


def test_every_user_error_type_derives_from_user_error():
    from data import DataError
    from data.shards import ShardError
    from evaluation.config import EvalConfigError
    from model.config import ConfigError as ModelConfigError
    from runtime.checkpoint import CheckpointError
    from trainer.loop import ConfigError as TrainConfigError
    for cls in (DataError, ShardError, EvalConfigError, ModelConfigError, TrainConfigError, CheckpointError):
        assert issubclass(cls, UserError), cls
    assert ModelConfigError is TrainConfigError is ConfigError  # one config error, wherever it is raised


def test_handler_prints_one_line_and_exits_2_for_user_errors(capsys):
    def bad():
        raise ConfigError("bad config train.max_steps=0:\n  must be a positive integer")
    with pytest.raises(SystemExit) as e:
        report_user_errors(bad)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: bad config train.max_steps=0: must be a positive integer\n"


def test_the_error_line_reaches_stderr_in_one_write(monkeypatch):
    """Ranks share one stderr; a line written as text then newline (print) lets another rank's line land
    between the two, and a reader matching whole lines misses both."""
    import sys

    writes = []

    class Recorder:
        def write(self, s):
            writes.append(s)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())
    with pytest.raises(SystemExit):
        report_user_errors(lambda: (_ for _ in ()).throw(ConfigError("data.files: no file matches 'x'")))
    assert writes == ["error: data.files: no file matches 'x'\n"]


def test_handler_lets_bugs_keep_their_traceback():
    def buggy():
        return {}["missing"]
    with pytest.raises(KeyError):
        report_user_errors(buggy)
    assert report_user_errors(lambda x: x + 1, 1) == 2


def test_registry_lists_valid_names_and_refuses_duplicates():
    reg = Registry("thing.kind")

    @reg.register("a")
    class A:
        pass

    reg.register("b")(lambda: 1)
    assert A.name == "a" and list(reg) == ["a", "b"] and "a" in reg and len(reg) == 2
    with pytest.raises(ConfigError, match=r"^unknown thing.kind='c': valid are a, b$"):
        reg["c"]
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(A)


def test_perplexity_is_exp_of_the_loss_clamped_where_it_would_overflow():
    import math

    from common import perplexity

    assert perplexity(2.0) == math.exp(2.0) and perplexity(None) is None
    assert perplexity(800.0) == math.inf and math.isnan(perplexity(math.nan))


def test_ctrl_c_in_an_entry_point_is_one_line_saying_what_was_kept(capsys):
    """A KeyboardInterrupt traceback used to be what eval.py, sample.py, data.prepare and branches.py left."""
    from common.errors import report_user_errors, set_interrupt_note

    def interrupted():
        raise KeyboardInterrupt

    set_interrupt_note("the shards finished so far are kept; rerun to resume")
    try:
        with pytest.raises(SystemExit) as e:
            report_user_errors(interrupted)
    finally:
        set_interrupt_note("nothing was written")
    err = capsys.readouterr().err
    assert e.value.code == 130 and err == "interrupted (Ctrl-C): the shards finished so far are kept; rerun to resume\n"


def test_a_scripts_unknown_component_name_is_one_line_with_the_valid_ones(capsys):
    """step_scale.py --cell a=norm=nope and paper.py --stand-in pile_books3=nope composed configs whose
    Hydra errors (a MissingConfigException, which is also an IOError) left tracebacks."""
    from experiments.step_scale import compose

    with pytest.raises(SystemExit) as e:
        report_user_errors(compose, ["norm=nope"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: In 'config': Could not find 'norm/nope' (valid: ")
    assert "pre_ln" in err and len(err.splitlines()) == 1
