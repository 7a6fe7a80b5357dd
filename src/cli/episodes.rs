//! The demo's script: episodes of a ScienceWorld-like agent, in order.
//! Texts are chosen so the toy embedder reproduces the interesting cases:
//! cold starts, patches, a failure record, a sibling at D_max, repeated
//! successes leading to a consolidation, and a later match on the
//! distilled root.

pub struct Episode {
    /// The goal: the task tree's scenario text.
    pub task: &'static str,
    /// The scene: the env tree's scenario text.
    pub env: &'static str,
    pub success: bool,
    /// What the agent did (the procedure, or the attempt that failed).
    pub steps: &'static str,
    /// Failed episodes: why it went wrong.
    pub failure_reason: &'static str,
    /// What the agent learned about the scene.
    pub facts: &'static str,
    /// The (simulated) extractor answers "skip": the retrieved chain
    /// already covers this episode, so nothing is written for the tree.
    pub skip_task: bool,
    pub skip_env: bool,
}

const KITCHEN: &str = "kitchen with a stove, a sink, a fridge and a metal pot";
const KITCHEN_LIT: &str = "kitchen with a stove, a sink, a fridge, a metal pot and a lighter";
const GREENHOUSE: &str = "greenhouse with flower pots, seed jars and a shovel";
const WORKSHOP: &str = "workshop with a thermometer, a table and substance B";

const fn ep(task: &'static str, env: &'static str, success: bool) -> Episode {
    Episode {
        task,
        env,
        success,
        steps: "",
        failure_reason: "",
        facts: "",
        skip_task: false,
        skip_env: false,
    }
}

pub const EPISODES: [Episode; 12] = [
    Episode {
        steps: "go to the kitchen; fill the metal pot at the sink; put it on the stove; activate the stove; wait",
        facts: "the sink and the stove are both in the kitchen; the metal pot is on the counter",
        ..ep("boil water", KITCHEN, true)
    },
    Episode {
        steps: "go to the greenhouse; put soil in a flower pot; plant an orange seed; water it",
        facts: "seed jars are on the shelf by the door",
        ..ep("grow an orange plant", GREENHOUSE, true)
    },
    Episode {
        steps: "fill the pot; put it on the stove; turn the stove on; watch for bubbles",
        facts: "the stove needs a lighter to start",
        ..ep("boil water on the stove", KITCHEN_LIT, true)
    },
    Episode {
        steps: "put the pot in the fridge hoping to warm it; waited 20 steps",
        failure_reason: "the fridge cools things down; the water never boiled",
        facts: "",
        skip_env: true,
        ..ep("boil water on the stove quickly", KITCHEN_LIT, false)
    },
    Episode {
        steps: "light the stove with the lighter first; then heat the full pot",
        facts: "",
        skip_env: true,
        ..ep("boil water on the stove quickly again", KITCHEN_LIT, true)
    },
    Episode {
        steps: "",
        facts: "",
        skip_task: true,
        skip_env: true,
        ..ep("boil water on the stove", KITCHEN_LIT, true)
    },
    Episode {
        steps: "",
        facts: "",
        skip_task: true,
        skip_env: true,
        ..ep("boil water on the stove", KITCHEN_LIT, true)
    },
    Episode {
        steps: "read the thermometer in the air, then guessed",
        failure_reason: "the thermometer never touched substance B",
        facts: "substance B is in a jar on the table",
        ..ep("measure the temperature of substance B", WORKSHOP, false)
    },
    Episode {
        steps: "pick up the thermometer; put it in the jar with substance B; read it after 3 steps",
        facts: "the thermometer hangs on the wall",
        ..ep(
            "measure the temperature of substance B with a thermometer",
            WORKSHOP,
            true,
        )
    },
    Episode {
        steps: "as before, then water the seedling every 5 steps until it flowers",
        facts: "the greenhouse tap is behind the shovel",
        ..ep("grow an orange plant until it flowers", GREENHOUSE, true)
    },
    Episode {
        steps: "",
        facts: "",
        skip_task: true,
        skip_env: true,
        ..ep("boil water on the stove", KITCHEN_LIT, true)
    },
    Episode {
        steps: "take ice from the fridge; put it in the metal pot; heat it on the stove",
        facts: "the freezer compartment holds ice cubes",
        ..ep("melt ice", KITCHEN, true)
    },
];

/// The questions asked of the finished bank: (tree, text).
pub const QUERIES: [(&str, &str); 3] = [
    ("task", "boil water on the stove"),
    ("task", "measure the temperature of substance B with a thermometer"),
    ("env", GREENHOUSE),
];
