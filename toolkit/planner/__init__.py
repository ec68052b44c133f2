"""The planner (`hpc plan`): time, cost and efficiency at N nodes, predicted from calibration runs or typed inputs.

model: the step-time model with its sources (pure arithmetic); inputs: what the model is given, typed or read;
calibration: reading calibration run dirs and the calibration record; calibrate: submitting calibration runs;
predict: one row per node count (throughput, efficiency, time to target, cost, bound, scaling rules).
"""
