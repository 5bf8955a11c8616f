//! The Redis Streams backend of stagedoor-jobs: one stream per queue with a consumer group, delayed jobs in a sorted set, a dead stream. Built in a later issue.
