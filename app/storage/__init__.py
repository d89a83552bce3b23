"""The log's own concepts over the two stores (app/stores/): the key layout, the
coordination records kept in Oxia (``metadata``), the codec of bodies and slices, the
writer and its commits, the index, the reader, retention and the topic catalog."""
