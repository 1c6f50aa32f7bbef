"""Every stateful RNN layer's states in every checkpoint, as one device
holds them.

A stateful RNN (LSTM(stateful=True)) keeps a state row per example of the
batch it was built for, carried from step to step. Keras creates those
variables untracked (RNN._create_state_variables), so they are not among
the model's variables the checkpoints hold: a resumed run restarted them
at zero (0.014 apart from the uninterrupted run after 6 + 6 steps, one
device and 2 replicas alike).

Each replica holds the rows of its own share of the batch: Keras assigns
the states in the step with aggregation "none", so every replica writes
its own component of the MirroredVariable, whose save keeps replica 0's
only. A checkpoint holds instead, per state, a host variable shaped for
the GLOBAL batch: the replicas' rows concatenated in replica order (an
all-gather over every replica of the job, each worker's too, as every
worker saves), what one device holds when replica r reads the r-th part of
each global batch. A restore hands each replica its rows back on every
worker (each reads the chief's checkpoint: no collective), so a checkpoint
moves between 1 device and N replicas as the weights do, for the same
global batch. A model without a stateful RNN adds nothing: no variable, no
collective.
"""
import tensorflow as tf

from dist_keras.contract import checks

KEY = "rnn_states"  # The checkpoint's part: rnn_states/0, rnn_states/1, ...


def variables(model) -> list:
  """The states of the model's stateful RNN layers, in their order."""
  return [v for layer in checks.stateful_layers(model)
          for v in tf.nest.flatten(layer.states)]


class States:
  """The host copies a checkpoint holds of `model`'s stateful RNN states
  (`held`), filled from the replicas before a save (gather) and handed
  back to them after a restore (put_back). Made outside the strategy's
  scope: each copy is this process's own variable."""

  def __init__(self, model):
    self._strategy = model.distribute_strategy
    self._layers = checks.stateful_layers(model)
    self._live = variables(model)
    replicas = self._strategy.num_replicas_in_sync
    self.held = [tf.Variable(tf.zeros([v.shape[0] * replicas,
                                       *v.shape[1:]], v.dtype),
                             trainable=False) for v in self._live]
    self._part = {KEY: self.held} if self.held else {}
    self._gathered = self._put = None  # tf.functions, traced once.

  def parts(self, saved=None) -> dict:
    """The checkpoint's part for the states: {KEY: variables}, {} for a
    model without them; the same dict whenever it is `held`. Restoring,
    `saved` is the checkpoint's {name: shape}: {} if it holds no states,
    and states saved for another global batch are read into throwaway
    variables (put_back then sets the replicas' to zero)."""
    if not self.held or saved is None or not self._other_batch(saved):
      return self._part  # (Another model's states fail the restore.)
    return {KEY: [tf.Variable(tf.zeros(saved[name], v.dtype))
                  for name, v in zip(_names(saved), self.held)]
            } if _names(saved) else {}

  def _other_batch(self, saved) -> bool:
    """Whether the checkpoint (its {name: shape}) holds no states or these
    states for another global batch."""
    shapes = [list(saved[name]) for name in _names(saved)]
    mine = [v.shape.as_list() for v in self.held]
    if not shapes:
      return True
    return shapes != mine and len(shapes) == len(mine) and all(
        theirs[1:] == ours[1:] for theirs, ours in zip(shapes, mine))

  def gather(self) -> None:
    """Every replica's rows into the host copies (a collective: every
    worker calls it as it saves)."""
    if not self.held:
      return
    self._gathered = self._gathered or tf.function(self._gather)
    for held, value in zip(self.held, self._gathered()):
      held.assign(value)

  def _gather(self):
    strategy = self._strategy

    def replica():
      ctx = tf.distribute.get_replica_context()
      # (Read first: under MultiWorkerMirroredStrategy an all_gather of
      # the variable itself fails, "destinations can not be empty".)
      return ctx.all_gather([tf.identity(v.value) for v in self._live],
                            axis=0)

    return [strategy.experimental_local_results(t)[0]
            for t in strategy.run(replica)]

  def put_back(self, saved, checkpoint: str) -> str | None:
    """After a restore (`saved`: its {name: shape}): each replica's rows
    from the host copies, or, from a checkpoint without them (saved before
    dist_keras kept them) or made for another global batch, every state at
    zero; returns the line that says so."""
    if not self.held:
      return None
    if not self._other_batch(saved):
      self._put = self._put or tf.function(self._scatter)
      self._put()
      return None
    for layer in self._layers:
      layer.reset_state()
    named = (f"the stateful RNN layer{'s' * (len(self._layers) > 1)} "
             + ", ".join(repr(layer.name) for layer in self._layers))
    if not _names(saved):
      return (f"{checkpoint} holds no states of {named} (saved before "
              "dist_keras kept them): they start at zero")
    return (f"{checkpoint} holds the states of {named} for a global batch "
            f"of {saved[_names(saved)[0]][0]}, not "
            f"{self.held[0].shape[0]}: they start at zero")

  def _scatter(self):
    def replica(every_row):
      ctx = tf.distribute.get_replica_context()
      for live, held in zip(self._live, every_row):
        rows = live.shape[0]
        live.assign(held[ctx.replica_id_in_sync_group * rows:][:rows])

    # The rows handed in, not the host variables read in the replicas (a
    # TPU's cannot read this host's).
    self._strategy.run(replica, args=([v.value() for v in self.held],))


def _names(saved) -> list[str]:
  """The checkpoint's names of the states, in their order."""
  names = [name for name in saved if name.startswith(KEY + "/")]
  return sorted(names, key=lambda name: int(name.split("/")[1]))
