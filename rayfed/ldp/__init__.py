"""Local differential privacy for numerical distributions: the Square Wave mechanism with EM/EMS
reconstruction and its baselines (categorical frequency oracles with binning, hierarchies, SR and
PM), after chapter 3 of Zitao Li's thesis / Li et al., SIGMOD 2020 (spec shared/specs/square-wave.md).

Every randomizer here is a pure, vectorised function of the users' values and uniforms drawn per
user id (so a user's report does not depend on which cohort hosts it); every estimator is a pure
function of the reports the aggregator received.
"""
