"""Which tests belong to the slow and the extended tiers, and why: the one table the
suite's tiers read.

Three tiers, each a superset of the one before:

* the quick tier, ``python -m pytest -m "not slow" -n 2`` (before a commit, under 3
  minutes on two cores), leaves out every test that a rule of :data:`SLOW_TESTS` or
  :data:`EXTENDED_TESTS` names. It still imports and exercises every module of matroot:
  the slow rules drop repetitions (another backend, another κ, another process count)
  and end-to-end runs, not the only test of a module.
* the default tier, ``python -m pytest -n 2`` (the README's test command, under 10
  minutes on two cores), runs every test but those :data:`EXTENDED_TESTS` names.
* the extended tier, :data:`EXTENDED_COMMAND`, runs exactly the tests
  :data:`EXTENDED_TESTS` names: repeats of a check the default tier makes once (another
  attempt at a rare hang, the long search beside the short ones, another dtype of a
  JAX compile). CI (``.ci/run``) runs it after the README's command, so CI runs every
  test. A command that names ``extended`` in ``-m``, or names an extended test by its
  node id, runs it; every other run leaves the extended tests out and says so.

A rule is a node-id pattern: ``*`` matches anything and ``[`` is literal, so
``tests/folder/test_x.py::test_y[jax-*`` names the JAX cases of ``test_y``. Every rule
must match a collected test (``project/test_tiers.py`` collects them), so a renamed
or moved test cannot drop into a quicker tier unnoticed: move its rule with it.
"""

from __future__ import annotations

import fnmatch
import re

#: (node-id pattern, why it is slow). One line per rule; a test matching any is slow.
SLOW_TESTS: tuple[tuple[str, str], ...] = (
    # JAX eager: every method, p, dtype and shape compiles a program of its own (3-5 s).
    ("tests/solvers/test_minimax.py::*[jax-*", "JAX compiles each table cell anew"),
    ("tests/polar/test_polar.py::*[jax-*", "JAX compiles each polar case anew"),
    ("tests/polar/test_polar_small_matrices.py::test_small_polar_factors_meet_the_bound[jax-*",
     "JAX compiles each size and method anew"),
    ("tests/accuracy/test_small_matrices.py::test_small_matrices_keep_the_table[5-*",
     "n = 5 and 7 repeat their neighbours' measurement"),
    ("tests/accuracy/test_small_matrices.py::test_small_matrices_keep_the_table[7-*",
     "n = 5 and 7 repeat their neighbours' measurement"),
    ("tests/inputs/test_inv_root_inputs.py::*[jax-*", "JAX compiles each bad-input case anew"),
    ("tests/inputs/test_properties.py::*[jax-*", "JAX compiles each dtype and shape anew"),
    ("tests/accuracy/test_converged_means_right.py::*[jax*", "JAX compiles each spectrum anew"),
    ("tests/testing/test_conformance.py::*[jax-*", "hypothesis examples, each a JAX compile"),
    ("tests/solvers/test_evd.py::*[jax-*", "JAX compiles the float64 retry anew"),
    ("tests/certify/test_lanczos.py::*[jax-*", "JAX compiles each Lanczos case anew"),
    ("tests/backends/test_jax.py::test_accuracy_table_under_jit[*", "a jax.jit compile per cell"),
    ("tests/backends/test_jax.py::test_16bit_matmuls_under_jit[*", "a jax.jit compile per method"),
    ("tests/backends/test_jax.py::test_an_eager_call_compiles_once_per_shape*", "several compiles"),
    ("tests/backends/test_jax.py::test_evd_without_x64*", "compiles with x64 off and on"),
    *((f"tests/backends/test_jax.py::test_nonfinite_matrix_isolated_under_jit[{method}]",
       "a jax.jit compile") for method in ("minimax", "coupled_newton")),
    ("tests/backends/test_jax.py::test_lower_bound_estimated_on_the_device_under_jit[chebyshev]",
     "a jax.jit compile"),
    ("tests/optim/test_optax.py::test_the_jitted_step_compiles_once[device_put]",
     "compiles a Shampoo step"),
    ("tests/project/test_docstrings.py::test_docstring_examples"
     "[matroot.optim.optax.shampoo_transform.shampoo]",
     "compiles a Shampoo step"),
    ("tests/project/test_docs.py::test_jax_examples_run_and_converge", "compiles a Shampoo step"),
    ("tests/backends/test_jax_watchdog.py::test_twenty_optax_steps*", "compiles a Shampoo step"),
    ("tests/backends/test_jax_user_loop.py::test_the_user_loop_finishes_for_every_root_method*",
     "trains with every root method in three fresh processes"),
    ("tests/accuracy/test_converged_means_right.py::test_isolated_top_at_n1024[*",
     "n = 1024 solves"),
    ("tests/optim/test_shampoo_sharded_state.py::test_a_dtensor_parameter_in_a_world_of_one*",
     "starts a process group"),
    ("tests/autodiff/test_gradients.py::test_jax_vmap_over_coupled_newton",
     "compiles a vmapped coupled Newton solve"),
    ("tests/project/test_optim_bench.py::test_digits_example_quick_run_writes_its_results",
     "trains a model"),
    # The accuracy table's other backends: the quick tier keeps NumPy and torch.
    ("tests/accuracy/test_accuracy_table.py::test_accuracy_table[array_api_strict-*",
     "repeats NumPy's cells through the strict namespace"),
    ("tests/solvers/test_minimax.py::test_accuracy_table[array_api_strict-*",
     "repeats NumPy's cells through the strict namespace"),
    ("tests/polar/test_polar.py::test_polar_express_meets_the_table[array_api_strict-*",
     "repeats NumPy's cells through the strict namespace"),
    # Conformance searches (hypothesis, 25 examples per method).
    ("tests/testing/test_conformance.py::test_conforms_on_other_namespaces[*",
     "hypothesis search on every namespace"),
    ("tests/accuracy/test_converged_means_right.py::test_converged_implies_the_table[*",
     "hypothesis search of the accuracy promise"),
    # End-to-end runs: benchmarks, docs, scripts, compilers, process groups.
    ("tests/project/test_bench_smoke.py::*", "runs the solver benchmark end to end in workers"),
    ("tests/project/test_docs.py::test_docs_build_without_warnings", "builds the docs with Sphinx"),
    ("tests/project/test_docs.py::test_support_page_matches_what_info_finds",
     "runs `matroot info`'s probe of every method on every backend"),
    ("tests/backends/test_torch_compile.py::*", "torch.compile traces and compiles"),
    ("tests/polar/test_polar_fitted.py::test_torch_compile_fullgraph_matches_eager",
     "torch.compile traces and compiles"),
    *((f"tests/backends/test_jax_compiles.py::{name}", "compiles several JAX programs")
      for name in ("test_an_eager_optax_step_compiles_nothing_new_once_warm",
                   "test_eps_zero_and_positive_are_two_programs_of_one_call",
                   "test_an_eager_gradient_is_a_few_programs",
                   "test_an_eager_vmap_compiles_once[refresh_eigenbasis]",
                   "test_an_eager_vmap_compiles_once[inv_root]")),
    ("tests/distributed/test_fsdp.py::*", "spawns gloo process groups (FSDP2, DCP)"),
    ("tests/distributed/test_distributed.py::*ranks]", "spawns a gloo process group"),
    ("tests/distributed/test_muon_distributed.py::*ranks]",
     "spawns gloo process groups (FSDP2, DDP, DCP)"),
    ("tests/distributed/test_muon_distributed.py::test_dcp_checkpoint_saved_at_two_ranks*",
     "spawns gloo process groups (FSDP2, DCP)"),
    *((f"tests/distributed/test_muon_distributed_optax.py::{name}", "a fresh JAX process "
       "with two host devices compiles sharded and single-device Muon steps")
      for name in ("test_stack_sharded_*", "test_each_device_*", "test_state_stays_*")),
    ("tests/distributed/test_distributed.py::test_memory_per_rank_is_below_single_process[3]",
     "spawns a gloo process group (the 2-rank case stays quick)"),
    ("tests/backends/test_jax_watchdog.py::test_jitted_solves_finish_under_a_watchdog",
     "100 jitted solves in a subprocess"),
    ("tests/optim/test_optax.py::test_shampoo_under_jit_beats_adamw_on_digits", "trains a model"),
    ("tests/polar/test_muon.py::test_muon_reaches_adamw_final_loss_in_fewer_steps_on_digits",
     "trains a model"),
    # The heaviest quick tests of this round (measured under --durations; each repeats
    # what a quicker test of the same module already exercises).
    ("tests/launches/test_optim_launches.py::*",
     "counts sixteen Shampoo steps on issue 35's model"),
    ("tests/optim/test_optim_factor_bounds.py::test_optax_carries_the_bounds_under_jit",
     "compiles a Shampoo step"),
    ("tests/optim/test_optim_refresh.py::test_the_default_refresh_under_jax_jit_matches*",
     "compiles a Shampoo step"),
    ("tests/distributed/test_distributed.py::test_memory_per_rank_is_below_single_process*",
     "starts process groups"),
    ("tests/optim/test_optim_torch.py::test_shampoo_solves_an_ill_conditioned_quadratic*",
     "trains to a tolerance"),
    ("tests/project/test_optim_bench.py::test_benchmark_times_the_compiled_step_against_eager",
     "compiles a Shampoo step"),
    ("tests/optim/test_optax_conventions.py::test_optax_apply_if_finite_wraps_shampoo_eagerly",
     "eager JAX, op by op"),
    ("tests/distributed/test_soap_distributed.py::*", "starts process groups"),
    ("tests/optim/test_soap_compile.py::*", "torch.compile traces SOAP steps (30 s here)"),
    ("tests/distributed/test_soap_fsdp.py::test_fsdp2_*",
     "spawns gloo process groups of 2 and 3 ranks (FSDP2, DCP)"),
    ("tests/optim/test_soap_optax.py::test_inject_hyperparams_learning_rate_under_jit",
     "compiles a SOAP step"),
    # Issue 39's cut (measured with --durations; each repeats a check that a quicker test
    # of the same module keeps in the quick tier, named in the reason).
    ("tests/backends/test_jax_user_loop.py::test_every_lapack_call_of_the_step_runs_without*",
     "compiles a Shampoo step; test_jax_watchdog's LAPACK check stays quick"),
    ("tests/backends/test_jax_user_loop.py::test_chunked_lapack_calls_give_the_unchunked*[shape1]",
     "repeats shape0's chunking check at another shape"),
    ("tests/backends/test_jax_user_loop.py::test_chunked_lapack_calls_give_the_unchunked*[shape2]",
     "repeats shape0's chunking check at another shape"),
    ("tests/backends/test_jax_user_loop.py::test_chunked_lapack_calls_give_the_unchunked*[shape3]",
     "repeats shape0's chunking check at another shape"),
    ("tests/certify/test_randomized_check.py::test_on_every_backend[jax]",
     "JAX compiles the check; test_under_jax_jit keeps JAX quick"),
    ("tests/accuracy/test_accuracy_target.py::test_jit_agrees_with_eager_within_rounding[newton*",
     "repeats minimax's jit-against-eager check (what auto runs) for another method"),
    ("tests/accuracy/test_accuracy_target.py::test_jit_agrees_with_eager_within_rounding[coupled*",
     "repeats minimax's jit-against-eager check (what auto runs) for another method"),
    ("tests/eigenbasis/test_eigenbasis.py::test_jax_jit_matches_eager_and_falls_back_by_where",
     "compiles refreshes; the SOAP optax jit test keeps the refresh under jit quick"),
    ("tests/eigenbasis/test_eigenbasis.py::test_adversarial_spectra[jax-*",
     "JAX compiles each spectrum anew; NumPy and torch keep them quick"),
    ("tests/eigenbasis/test_eigenbasis.py::test_soap_refresh_converges_without_fallback[jax-*",
     "JAX compiles each case anew; NumPy and torch keep them quick"),
    ("tests/eigenbasis/test_eigenbasis.py::test_nan_basis_falls_back_to_eigh_for_that*[jax]",
     "JAX compiles the fallback; NumPy and torch keep it quick"),
    ("tests/eigenbasis/test_eigenbasis.py::test_batch_shape_and_float16_come_back[jax]",
     "JAX compiles each dtype; NumPy and torch keep it quick"),
    ("tests/eigenbasis/test_eigenbasis.py::test_nan_matrix_changes_no_neighbour[jax]",
     "JAX compiles the refresh; NumPy and torch keep it quick"),
    ("tests/optim/test_optax.py::test_the_jitted_step_compiles_once[default]",
     "compiles a Shampoo step and counts the compiles"),
    ("tests/optim/test_optax.py::test_optax_matches_numpy_core[jit-roots-not-kept]",
     "repeats [jit] with roots not kept"),
    ("tests/optim/test_optax.py::test_a_root_that_overflows_float16_storage_is_a_counted*",
     "compiles a Shampoo step; the torch shell's twin (test_shampoo_root_storage) is quick"),
    ("tests/optim/test_soap_optax.py::test_nan_gradient_is_skipped_under_jit",
     "compiles a SOAP step; the NaN screen is block_core's, quick in the Shampoo test"),
    ("tests/inputs/test_input_forms.py::test_jax_eager_takes_bound_arrays_of_any_library[*-evd]",
     "eager JAX, op by op: minimax's case keeps it quick"),
    ("tests/inputs/test_input_forms.py::test_jax_eager_takes_bound_arrays_of_any_library[*-newton*",
     "eager JAX, op by op: minimax's case keeps it quick"),
    ("tests/polar/test_muon.py::test_muon_vs_adamw_example_quick_run_writes_its_table",
     "runs examples/muon_vs_adamw.py end to end"),
    ("tests/accuracy/test_loose_tolerances.py::test_minimax_p1_loose_tol_under_jax_jit",
     "compiles a minimax solve; the same loose-tol case runs eagerly in the quick tier"),
    ("tests/project/test_docstrings.py::test_docstring_examples"
     "[matroot.optim.optax.block_core.block_core_transform]",
     "a SOAP step in eager JAX; soap's example runs the same shell quick"),
    ("tests/launches/test_launch_budgets.py::test_operations_and_syncs_per_solve[minimax-2]",
     "repeats p = 4's count at p = 2"),
    ("tests/accuracy/test_converged_means_right.py::test_drifted_coupled_iterates_are_not*"
     "[kappa1e8-newton_db-2]", "repeats coupled Newton's κ = 1e8 case for another method"),
    ("tests/accuracy/test_converged_means_right.py::test_drifted_coupled_iterates_are_not*"
     "[kappa1e8-minimax-2]", "repeats coupled Newton's κ = 1e8 case for another method"),
    ("tests/accuracy/test_converged_means_right.py::test_drifted_coupled_iterates_are_not*"
     "[kappa1e8-coupled_newton-1]", "repeats p = 2's κ = 1e8 case at p = 1"),
    ("tests/autodiff/test_gradients.py::test_jax_forward_mode_derivative",
     "JAX's jvp compiles; torch's forward mode and JAX's grad under jit stay quick"),
    ("tests/certify/test_lanczos.py::test_estimate_keeps_namespace_and_clips[jax]",
     "JAX compiles Lanczos; the restarts-under-jit test keeps JAX quick"),
    ("tests/eigenbasis/test_refresh_work.py::test_a_converged_matrix_keeps_its_step_while*[jax]",
     "JAX compiles the refresh; NumPy, torch and the strict namespace keep it quick"),
)


#: The command that runs the extended tier; ``.ci/run`` runs it after the README's.
EXTENDED_COMMAND = 'python -m pytest -n 2 -m extended'

#: (node-id pattern, why it waits for the extended tier). A test matching any is
#: extended (and slow); each reason names the check the default tier keeps.
EXTENDED_TESTS: tuple[tuple[str, str], ...] = (
    ("tests/inputs/test_adversarial_inputs.py::test_converged_means_right_on_nasty_constructions_long",
     "the long hunt (600 examples) beside the default tier's 40"),
    ("tests/inputs/test_adversarial_inputs.py::test_a_bad_neighbour_changes_no_bits_long",
     "the long neighbour hunt (150 examples) beside the default tier's 8"),
    # Repeats of a check the default tier makes once (CPU seconds on two cores, measured
    # with --durations and per-test CPU time under -n 2, 2026-12-07).
    ("tests/backends/test_jax_user_loop.py::test_the_user_loop_finishes_for_every_root_method[1]",
     "another attempt at the rare LAPACK deadlock (65 s with [2]); attempt [0] stays default"),
    ("tests/backends/test_jax_user_loop.py::test_the_user_loop_finishes_for_every_root_method[2]",
     "another attempt at the rare LAPACK deadlock; attempt [0] stays default"),
    ("tests/backends/test_jax_user_loop.py::test_the_user_loop_finishes_with_default_flags",
     "newton_db's loop alone in a fresh process (14 s): attempt [0] runs it among every method"),
    ("tests/polar/test_polar_small_matrices.py::"
     "test_small_polar_factors_meet_the_bound[jax-float64-*",
     "repeats the float32 cells' JAX sweep in float64 (17 s); NumPy and torch keep float64"),
    ("tests/accuracy/test_adversarial_search.py::test_converged_means_right_on_searched_inputs_long",
     "the long search up to n = 512 (45 s); the two n <= 128 searches stay default"),
    ("tests/accuracy/test_accuracy_table.py::test_accuracy_table[jax-*",
     "eager JAX compiles each (method, p, dtype) (118 s): backends/test_jax.py's jit table "
     "keeps every (method, p) on JAX, NumPy and torch every eager cell"),
    ("tests/solvers/test_minimax.py::test_accuracy_table[jax-*",
     "eager JAX compiles each cell (23 s); NumPy, torch and the strict namespace stay"),
    ("tests/inputs/test_properties.py::test_output_keeps_namespace_device_dtype[jax-*-float64]",
     "repeats the float32 cell's JAX compile in float64 (9 s)"),
    *((f"tests/accuracy/test_accuracy_table.py::test_accuracy_n1024[{case}]",
       "repeats minimax's and evd's n = 1024 solve for another method (9 s)")
      for case in ("newton_db-2", "newton_db-4", "coupled_newton-4")),
    *((f"tests/solvers/test_matmul_targets.py::test_matmul_target[*-kappa{kappa}-*",
       "repeats κ = 1e2's check at a larger κ (15 s)") for kappa in ("1e+04", "1e+06")),
    ("tests/certify/test_lambda_max_bounds.py::test_bound_certificate_keyword[jax]",
     "JAX compiles the solve once per certificate (13 s); NumPy, torch and the strict "
     "namespace stay"),
    ("tests/eigenbasis/test_eigenbasis.py::test_torch_compile_matches_eager",
     "torch.compile of the refresh (23 s); test_soap_compile compiles SOAP steps that refresh"),
    ("tests/optim/test_optax.py::test_optax_matches_numpy_core[eager]",
     "eager JAX, op by op (16 s); the jitted step (what users run) stays"),
    ("tests/optim/test_soap_optax.py::test_jit_steps_equal_the_torch_shell[adam-grafting]",
     "compiles a SOAP step (10 s); [plain] stays, grafting is checked against the reference"),
    ("tests/testing/test_conformance.py::test_conforms_on_other_namespaces[jax-evd]",
     "a hypothesis search compiling each example on JAX (26 s, the last test to end "
     "under -n 2); NumPy checks every method, torch and the strict namespace stay"),
    ("tests/testing/test_conformance.py::test_conforms_on_other_namespaces[jax-newton_db]",
     "a hypothesis search compiling each example on JAX (31 s); torch and the strict "
     "namespace stay"),
    ("tests/project/test_gpu_check.py::test_dry_run_records_every_step",
     "the GPU script's dry run (21 s): it checks bench/gpu_check.sh, not the library"),
    ("tests/accuracy/test_converged_means_right.py::"
     "test_certified_lambda_max_is_never_below_lambda_max[jax-float*",
     "JAX compiles each spectrum anew (35 s); NumPy, torch and the strict namespace stay"),
    ("tests/accuracy/test_converged_means_right.py::test_converged_implies_the_table[jax]",
     "a hypothesis search compiling each example on JAX (27 s); the other namespaces stay"),
    ("tests/inputs/test_inv_root_inputs.py::test_non_finite_matrix_is_isolated[jax-*",
     "eager JAX compiles each method (25 s); test_nonfinite_matrix_isolated_under_jit "
     "keeps JAX in the default tier, NumPy, torch and the strict namespace every method"),
    *((f"tests/backends/test_jax.py::test_jit_matches_eager[{method}]",
       "repeats coupled Newton's jit-against-op-by-op check for another method (25 s)")
      for method in ("newton_db", "evd", "chebyshev", "minimax")),
    *((f"tests/backends/test_torch_compile.py::test_inv_root_compiles_to_one_graph[{case}]",
       "repeats minimax's one-graph compile (what auto runs) for another method (23 s)")
      for case in ("newton_db-3", "coupled_newton-3", "chebyshev-8")),
    *((f"tests/launches/test_launch_budgets.py::test_fixed_steps_keep_the_promise[*-{p}]",
       "repeats p = 4's search at another p (19 s)") for p in (1, 2, 8)),
    *((f"tests/launches/test_launch_budgets.py::test_operations_and_syncs_per_solve[{m}-*",
       "repeats minimax's count (what auto runs) for another method (15 s)")
      for m in ("newton_db", "coupled_newton")),
    ("tests/distributed/test_distributed.py::test_memory_per_rank_is_below_single_process[4]",
     "a 4-rank process group for one measurement (22 s); 2 and 3 ranks stay default"),
    # 4-rank process groups (HSDP's 2 × 2 mesh): 22-28 s each, the 2- and 3-rank FSDP2 runs
    # of the same module (the same whole-gradient route) stay default.
    ("tests/distributed/test_fsdp.py::test_per_rank_state_is_a_share_of_the_single_process_state[4]",
     "a 4-rank HSDP process group; the 2- and 3-rank cases stay default"),
    ("tests/distributed/test_fsdp.py::test_hsdp_*",
     "a 4-rank HSDP process group; the FSDP2 runs at 2 and 3 ranks stay default"),
    ("tests/distributed/test_muon_distributed.py::test_hsdp_*",
     "a 4-rank HSDP process group; the FSDP2 runs at 2 and 3 ranks stay default"),
    ("tests/distributed/test_soap_fsdp.py::test_hsdp_*",
     "a 4-rank HSDP process group; the FSDP2 runs at 2 and 3 ranks stay default"),
    # The heaviest default tests of 2026-12-07's --durations (seconds unloaded, about a
    # quarter of what a loaded run printed); each names what the default tier keeps.
    ("tests/optim/test_soap_compile.py::test_a_step_compiled_by_inductor_runs_past*",
     "Inductor compiles a SOAP step (30 s); the module's eager-backend compiles stay default"),
    ("tests/project/test_docs.py::test_jax_examples_run_and_converge",
     "compiles the docs' JAX Shampoo examples (33 s); the docstring examples stay default"),
    ("tests/project/test_docs.py::test_support_page_matches_what_info_finds",
     "`matroot info` probes every method on every backend (31 s); test_cli's info "
     "tests stay default"),
    ("tests/project/test_docs.py::test_docs_build_without_warnings",
     "builds the docs with Sphinx (21 s); the docstring examples stay default"),
    ("tests/project/test_bench_smoke.py::*",
     "runs the solver benchmark end to end in workers (35 s): it checks bench/, not matroot"),
    ("tests/backends/test_jax.py::test_an_eager_call_compiles_once_per_shape*",
     "several JAX compiles (21 s); test_jax_compiles counts eager programs in the default tier"),
    ("tests/backends/test_torch_compile.py::test_dynamic_shapes_batch_dimension_and_evd",
     "recompiles for dynamic shapes (21 s); the one-graph compile of minimax stays default"),
)


def _glob(pattern: str) -> str:
    """``pattern`` with ``[`` literal, as fnmatch would otherwise read a character class."""
    return pattern.replace("[", "[[]")


_GLOBS = tuple((_glob(pattern), reason) for pattern, reason in SLOW_TESTS)
_EXTENDED_GLOBS = tuple((_glob(pattern), reason) for pattern, reason in EXTENDED_TESTS)


def matches(pattern: str, node_id: str) -> bool:
    """Whether the rule ``pattern`` names the test ``node_id``."""
    return fnmatch.fnmatchcase(node_id, _glob(pattern))


def slow_reason(node_id: str, markers: set[str]) -> str | None:
    """Why the test ``node_id`` (marked with ``markers``) is slow, or None when it
    belongs to the quick tier. A test marked ``compile`` (torch.compile) is slow."""
    if "compile" in markers:
        return "torch.compile traces and compiles"
    for glob, reason in _GLOBS:
        if fnmatch.fnmatchcase(node_id, glob):
            return reason
    return extended_reason(node_id)


def extended_reason(node_id: str) -> str | None:
    """Why the test ``node_id`` waits for the extended tier, or None when the
    default tier (the README's test command) runs it."""
    for glob, reason in _EXTENDED_GLOBS:
        if fnmatch.fnmatchcase(node_id, glob):
            return reason
    return None


def runs_extended(markexpr: str) -> bool:
    """Whether a run with ``-m markexpr`` selects the extended tier by name (the
    extended tier's own command, or an expression such as ``"slow or extended"``)."""
    return re.search(r"\bextended\b", markexpr) is not None


#: Whether this run is the quick tier (``-m "not slow"``): set by conftest's
#: ``pytest_configure`` before any test module is imported.
QUICK_RUN = False

#: Whether this run searches thoroughly (``--hypothesis-profile=thorough``): the
#: searches that name a ``thorough`` count draw it instead of their default one.
THOROUGH_RUN = False

#: The share of a hypothesis search's examples that the quick tier draws: the same
#: strategies and assertions, fewer draws; the full suite searches with them all.
QUICK_SHARE = 0.2


def examples(full: int, *, thorough: int | None = None) -> int:
    """``max_examples`` for a hypothesis search of ``full`` examples in the full suite:
    :data:`QUICK_SHARE` of them (at least 3) in the quick tier, and ``thorough`` (where
    given) under ``--hypothesis-profile=thorough``."""
    if THOROUGH_RUN and thorough is not None:
        return thorough
    return max(3, round(full * QUICK_SHARE)) if QUICK_RUN else full
