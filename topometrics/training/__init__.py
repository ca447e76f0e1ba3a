"""Training: the corpus, one run's training loop, its run directory, and the queue that trains every run.

Entry points: ``corpus.prepare`` (resolve, verify and tokenise the corpus); ``train.train_run`` (one run,
resumable, with observers called at each step and checkpoint; it knows nothing about topology);
``run_dir.claim_run_dir`` / ``resume_step``; ``run_queue.train_runs`` (every run over a process pool, what
the train stage runs); ``live_relay.LiveRelay`` (the runs' losses and monitor logs into one dvclive folder);
``sketch.SketchRecorder`` (an observer recording a seeded JL sketch of the weights every few steps;
``sketch.read_sketch`` reads it back).
"""
