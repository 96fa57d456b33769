"""Engine replicas on Ray Serve behind one OpenAI front door, routed by what each replica's
radix tree holds (the ``radixserve[cluster]`` extra)."""
