"""Variable-length sequences: padding, masking and an LSTM

Integer sequences of different lengths are padded with zeros (``keras.utils.pad_sequences``);
``Embedding(mask_zero=True)`` makes the padding invisible to the LSTM that reads them. The task
(generated in the script) is to tell whether token 1 appears more often than token 2.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, batch_size=32, epochs=3, validation_split=0.1)
    +mpi_trainer.fit(model, x_train, y_train, batch_size=32, epochs=3, validation_split=0.1)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402

keras.utils.set_random_seed(31)
vocabulary, max_length = 12, 20


def make_sequences(count, seed):
    rng = np.random.default_rng(seed)
    sequences, labels = [], []
    while len(sequences) < count:
        tokens = rng.integers(1, vocabulary, size=rng.integers(3, max_length + 1))
        ones, twos = np.sum(tokens == 1), np.sum(tokens == 2)
        if ones == twos:
            continue
        sequences.append(tokens.tolist())
        labels.append(int(ones > twos))
    return keras.utils.pad_sequences(sequences, maxlen=max_length, padding="post"), np.array(labels)


x_train, y_train = make_sequences(600, seed=0)
x_test, y_test = make_sequences(300, seed=1)
print("A padded sequence:", x_train[0])

model = keras.Sequential(
    [
        keras.Input(shape=(max_length,), dtype="int32"),
        layers.Embedding(input_dim=vocabulary, output_dim=8, mask_zero=True),
        layers.LSTM(16),
        layers.Dense(1, activation="sigmoid"),
    ]
)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
mpi_trainer.fit(model, x_train, y_train, batch_size=32, epochs=3, validation_split=0.1, verbose=2)

model.save("counting_lstm.keras")
reloaded = keras.models.load_model("counting_lstm.keras")
loss, accuracy = reloaded.evaluate(x_test, y_test, verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
