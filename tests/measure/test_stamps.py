"""A step's in-graph stamps (measure/stamps.py): a stamp under a replica's
clock reads one element of every tensor it waits for, whatever its kind."""
import numpy as np
import tensorflow as tf

from dist_keras.measure import stamps

# One of each kind a batch or a gradient brings: floats, integers, a bool,
# text (no cast: its length), an empty tensor, a ragged feature.
KINDS = {
    "float": tf.reshape(tf.range(6.0), [2, 3]),
    "int64": tf.constant([7, 8], tf.int64),
    "bool": tf.constant([True, False]),
    "text": tf.constant(["ab", "c"]),
    "empty": tf.zeros([0, 3]),
    "ragged": tf.ragged.constant([[4, 5], [6]]),
}


def test_each_first_element_is_read_as_a_number():
  flat = tf.nest.flatten(list(KINDS.values()), expand_composites=True)
  firsts = [f.numpy().tolist() for f in stamps._firsts_as_numbers(flat)]  # pylint: disable=protected-access
  # The ragged feature: its values' first, then its row splits' first.
  assert firsts == [[0.0], [7.0], [1.0], [2.0], [], [4.0], [0.0]]


def test_the_stamp_depends_on_every_tensor_by_data():
  """Data, not control: control dependencies of the clock's function call
  do not survive its inlining, so a stamp held only by them could be read
  before its tensors exist."""
  clock = stamps.make_clock(tf.distribute.get_strategy())
  named = {}

  @tf.function(autograph=False)
  def stamp():
    for name, value in KINDS.items():
      named[name] = tf.nest.map_structure(
          lambda t, n=name: tf.identity(t, name=n), value,
          expand_composites=True)
    return stamps.stamp_after(list(named.values()), clock)

  graph = stamp.get_concrete_function().graph
  reached, todo = set(), [graph.outputs[0].op]
  while todo:  # Every op the stamp reads through data inputs.
    op = todo.pop()
    if op.name not in reached:
      reached.add(op.name)
      todo.extend(t.op for t in op.inputs)
  for name, value in named.items():
    for t in tf.nest.flatten(value, expand_composites=True):
      assert t.op.name in reached, f"{name}: {t.op.name}"
  assert np.isfinite(stamp().numpy())
