package pipeline

// WorkerOf is the worker, of n, that processes a queue's batches: tests place queues on
// workers of their choice with it.
var WorkerOf = workerOf
