"""Text classification from a NumPy array of strings

Short product reviews (generated in the script from word lists, so nothing is downloaded) are
kept as a NumPy array of strings, one review per row (shape ``(n, 1)``). A ``TextVectorization``
layer is adapted on the training text before ``fit`` and placed inside the model, after an
``Input(shape=(1,), dtype="string")``, so the trained model takes raw strings. Keras 3's array
adapter does not slice NumPy string arrays, so the arrays given to ``fit``, ``evaluate`` and
``predict`` are converted with ``tf.constant`` first.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(tf.constant(x_train), y_train, batch_size=32, epochs=4, validation_split=0.1)
    +mpi_trainer.fit(model, tf.constant(x_train), y_train, batch_size=32, epochs=4, validation_split=0.1)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers  # noqa: E402

keras.utils.set_random_seed(2024)

POSITIVE = ["great", "excellent", "love", "perfect", "wonderful", "sturdy", "fast", "comfortable", "happy"]
NEGATIVE = ["broken", "terrible", "awful", "slow", "refund", "cheap", "disappointed", "flimsy", "waste"]
NEUTRAL = ["the", "this", "product", "arrived", "box", "it", "was", "and", "my", "after", "days", "use", "really"]


def make_reviews(count, seed):
    """Reviews of 6-14 words; a positive one has more positive than negative words."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(count):
        label = int(rng.integers(0, 2))
        majority, minority = (POSITIVE, NEGATIVE) if label else (NEGATIVE, POSITIVE)
        words = list(rng.choice(NEUTRAL, size=rng.integers(4, 9)))
        words += list(rng.choice(majority, size=rng.integers(2, 4)))
        words += list(rng.choice(minority, size=rng.integers(0, 2)))
        rng.shuffle(words)
        texts.append(" ".join(words).capitalize() + "!")
        labels.append(label)
    return np.array(texts)[:, None], np.array(labels)


x_train, y_train = make_reviews(1200, seed=0)
x_test, y_test = make_reviews(300, seed=1)
print(x_train[:3], y_train[:3])

vectorize_layer = layers.TextVectorization(max_tokens=200, output_mode="int", output_sequence_length=16)
vectorize_layer.adapt(x_train)
print("Vocabulary size:", vectorize_layer.vocabulary_size())

inputs = keras.Input(shape=(1,), dtype="string")
x = vectorize_layer(inputs)
x = layers.Embedding(200, 16)(x)
x = layers.GlobalAveragePooling1D()(x)
x = layers.Dense(16, activation="relu")(x)
outputs = layers.Dense(1, activation="sigmoid")(x)
model = keras.Model(inputs, outputs)
model.compile(loss="binary_crossentropy", optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"])

mpi_trainer.fit(model, tf.constant(x_train), y_train, batch_size=32, epochs=4, validation_split=0.1, verbose=2)

print(model.predict(tf.constant([["Great product, I love it!"], ["Broken after two days, what a waste."]]), verbose=0))
loss, accuracy = model.evaluate(tf.constant(x_test), y_test, verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
