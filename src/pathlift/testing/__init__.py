"""What pathlift's tests (and users checking pathlift on their own small networks) compute
the same numbers with, independently of the engine: the explicit neuron DAG of thesis
Def. 2.2.2 (``pathlift.testing.neurons``)."""
