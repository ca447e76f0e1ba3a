"""How a run's quantities change over training: the dimension of its trajectory and the changepoints of its series.

Entry points: ``phdim.ph_dimension`` (the PH0 dimension of a cloud of iterates, Birdal et al. 2021 /
Adams et al. 2020) and ``phdim.trailing_dimension`` (of the iterates in a trailing window of steps);
``trajectory.trajectory_values`` (a run's trajectory features: the PH0 dimension of its sketched iterates
in a trailing window, from ``trajectory.checkpoint_iterates`` or the training sketch);
``changepoints.changepoints`` (the breaks of one series, ``ruptures``' PELT with
``jump=1``), ``changepoints.series_changepoints`` (first changepoint step and count) and
``changepoints.changepoint_lags`` (a feature's first changepoint against the validation loss's and the
learning rate's); ``changepoints.window_changepoints`` (what several series' changepoints say by a
cutoff step: the verdict's changepoint inputs). Pure functions of arrays; nothing here reads or writes a file.
"""
