"""Active-active replicas sharing routing state: peers, the ZMQ transport and the sync hub."""
