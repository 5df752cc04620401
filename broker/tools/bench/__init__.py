"""``tandem bench``: one workload against Tandem and its peers (RabbitMQ, NATS JetStream)."""
