//! Placeholder replaced by the planner branch.
