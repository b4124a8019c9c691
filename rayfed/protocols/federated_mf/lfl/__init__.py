"""The LFL setting of ``federated-mf`` (LFL-SGDMF, spec federated-mf.md §2.7–2.9): every user is
simulated in a cohort actor, the coordinator is the server holding V, and each iteration's
gradients cross through real secure aggregation. Its params, plan, steps, driver and report."""
