"""Text classification from a tf.data.Dataset of strings

The labelled sentences (generated in the script: which of three topics a sentence is about) are
a ``tf.data.Dataset`` of ``(string, label)`` pairs, batched, as ``text_dataset_from_directory``
would give them. A ``TextVectorization`` layer is adapted on the text alone
(``dataset.map(lambda text, label: text)``) and the model starts with
``Input(shape=(), dtype="string")``.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(train_ds, validation_data=val_ds, epochs=4)
    +mpi_trainer.fit(model, train_ds, validation_data=val_ds, epochs=4)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers  # noqa: E402

keras.utils.set_random_seed(99)

TOPICS = {
    "sports": ["match", "goal", "team", "coach", "league", "score", "season", "player"],
    "weather": ["rain", "sunny", "storm", "forecast", "wind", "cloudy", "snow", "temperature"],
    "cooking": ["recipe", "oven", "flour", "garlic", "bake", "salt", "dinner", "pan"],
}
FILLER = ["the", "a", "today", "we", "saw", "about", "very", "new", "of", "and", "is", "was", "big"]


def make_sentences(count, seed):
    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    texts, labels = [], []
    for _ in range(count):
        label = int(rng.integers(0, len(names)))
        words = list(rng.choice(FILLER, size=rng.integers(3, 8))) + list(rng.choice(TOPICS[names[label]], size=2))
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(label)
    return tf.data.Dataset.from_tensor_slices((texts, labels))


train_ds = make_sentences(1000, seed=0).batch(32)
val_ds = make_sentences(200, seed=1).batch(32)
test_ds = make_sentences(300, seed=2).batch(32)

for text_batch, label_batch in train_ds.take(1):
    print("Sentence:", text_batch.numpy()[0], "label:", label_batch.numpy()[0])

vectorize_layer = layers.TextVectorization(max_tokens=100, output_sequence_length=12)
vectorize_layer.adapt(train_ds.map(lambda text, label: text))

inputs = keras.Input(shape=(), dtype="string")
x = vectorize_layer(inputs)
x = layers.Embedding(100, 16)(x)
x = layers.GlobalAveragePooling1D()(x)
outputs = layers.Dense(3, activation="softmax")(x)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(0.02), loss="sparse_categorical_crossentropy", metrics=["accuracy"])

mpi_trainer.fit(model, train_ds, validation_data=val_ds, epochs=4, verbose=2)

model.save("topics.keras")
reloaded = keras.models.load_model("topics.keras")
print(reloaded.predict(tf.constant(["the coach saw a goal", "rain and wind today"]), verbose=0).argmax(axis=1))
loss, accuracy = reloaded.evaluate(test_ds, verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
