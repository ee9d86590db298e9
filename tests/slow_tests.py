"""The tests ``make check`` leaves out (marked ``slow``; ``make test`` runs every test, as CI does).

Each entry is a test id or the start of one (a file, a test, or a test's parameter cases by a common prefix).
Chosen from ``pytest --durations=60 --durations-min=1.5 FILE...`` over the files that start processes or train
real models (on 2 CPU cores shared with other jobs): every test that took 4 s or more there.
To keep the list true: run ``pytest --durations=30 -m "not slow"`` now and then and add what is slow; an entry
that matches no test of a collected file stops the collection (a renamed test must be renamed here too).
"""

SLOW = (
    # real processes: a SIGKILLed run, signals before training, a second process on a locked directory
    "tests/engine/test_resume.py::test_sigkill_at_any_moment_then_resume_gives_the_same_run",
    "tests/engine/test_signals.py::test_sigterm_before_training_stops_at_once_with_a_message_and_leaves_nothing",
    "tests/app/test_refusals_run.py::test_a_second_process_is_refused_while_a_run_holds_the_directory_and_not_after",
    "tests/app/test_refusals_run.py::test_overwrite_and_links_leave_the_users_files_as_they_were",
    "tests/app/test_refusals_run.py::test_overwrite_replaces_only_after_a_successful_build",
    "tests/app/test_refusals_run.py::test_overwrite_replaces_a_marked_run_directory_and_a_marked_older_one",
    # every plugin refusal case runs a cfl command in a process of its own (3-18 s each)
    "tests/methods/test_refusals_plugins.py::test_plugin_refusal_or_stop",
    # sweeps of several processes and Ray (17, 11 and 13 s)
    "tests/app/test_sweep.py::test_a_diverging_run_fails_alone_and_the_sweep_exits_1",
    "tests/app/test_sweep.py::test_parallel_jobs_give_the_same_results_as_one_after_another",
    "tests/app/test_ray_backend.py",
    # the larger models in every method (2-9 s each; the small models keep every method in the check)
    "tests/engine/test_batched_equals_sequential.py::test_every_model_and_method_run_alike_end_to_end[alexnet-",
    "tests/engine/test_batched_equals_sequential.py::test_every_model_and_method_run_alike_end_to_end[resnet18-mini-",
    # the evidence tooling: a campaign of real runs cut off and resumed, the device check's dry mode (50 s each)
    "tests/project/test_campaign.py::test_a_campaign_cut_off_packed_and_resumed_elsewhere_equals_an_uninterrupted_one",
    "tests/project/test_device_check.py",
    # perf_engine.py's bf16-mixed path in a process of its own (about 50 s: two engines and the peak products)
    "tests/project/test_dispatch_count.py::test_perf_engine_runs_its_bf16_mixed_path",
    "tests/app/test_sweep_signals.py",
    # single slow cases
    "tests/engine/test_checkpoint.py::test_every_method_resumes_bit_for_bit[mfcl]",
    "tests/engine/test_engine.py::test_same_seed_same_matrix_bit_for_bit_and_other_seed_differs[bf16-mixed]",
    "tests/engine/test_precision.py::test_float32_step_from_a_bfloat16_product[1.0]",
    "tests/report/test_wandb_faults.py::test_online_mode_with_bad_credentials_and_no_network",
)
