"""What the engineer writes: the goal (`goal`: text or TOML -> `GoalSpec`) and the workspace's
`infergoal.toml` (`workspace`)."""
