package pacer

import "github.com/redis/go-redis/v9"

var _ = redis.NewClient
