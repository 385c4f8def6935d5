"""The job supervisor: starts a job's processes, follows its reports, records its lifecycle."""
