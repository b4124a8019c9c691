"""The partitioned settings of ``federated-mf`` (spec federated-mf.md §2.5–2.6, §3.2): VFL-SGDMF,
parties hold disjoint item sets and the server averages U; HFL-SGDMF, parties hold disjoint user
sets and the server averages V. Their params, plan, steps, driver and report."""
