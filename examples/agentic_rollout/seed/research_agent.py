# The custom agent example of the AgenticRollout design document (a research agent), as
# the document writes it. Only its import line changed (from verl.workers.rollout...),
# and `logger`, which the example uses without defining, is defined (docs/agents.md,
# "AgenticRollout": what the examples needed).
import logging

from kernelflow.agentic_rollout import BaseAgent, register_agent, Trajectory, TrajectoryStep, StepType

logger = logging.getLogger(__name__)

@register_agent("research")
class ResearchAgent(BaseAgent):
    """专门用于研究任务的智能体"""
    
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.research_depth = kwargs.get("research_depth", 3)
        self.verification_enabled = kwargs.get("verification_enabled", True)
        self.current_research_phase = "planning"
    
    def create_system_prompt(self) -> str:
        """创建研究智能体的系统提示"""
        return """You are a research agent specialized in gathering and analyzing information.

Your research process:
1. Plan your research strategy
2. Gather information from multiple sources  
3. Cross-reference and verify findings
4. Synthesize comprehensive conclusions

Use tools systematically and always verify important claims."""
    
    async def run_trajectory(self, prompt, llm_generate_func, request_id, **kwargs):
        """执行研究轨迹"""
        trajectory = Trajectory(request_id=request_id)
        
        # 添加初始观察
        research_question = str(prompt.get('content', prompt))
        initial_step = TrajectoryStep(
            step_type=StepType.OBSERVATION,
            content=research_question,
            metadata={"research_question": research_question, "phase": "initial"}
        )
        trajectory.add_step(initial_step)
        
        research_rounds = 0
        max_research_rounds = self.research_depth
        
        while self.should_continue(trajectory) and research_rounds < max_research_rounds:
            try:
                # 生成下一步行动
                messages = self.format_messages_for_llm(trajectory)
                messages.append({
                    "role": "user",
                    "content": f"Research round {research_rounds + 1}/{max_research_rounds}. What should you do next?"
                })
                
                response = await llm_generate_func(
                    messages,
                    max_tokens=self.max_tokens_per_step,
                    temperature=self.temperature
                )
                
                # 解析响应
                step = self._parse_research_output(response, research_rounds)
                trajectory.add_step(step)
                
                # 执行工具调用
                if step.step_type == StepType.ACTION and step.tool_name:
                    result_step = await self.execute_tool_call(
                        step.tool_name, step.tool_args or {}, trajectory
                    )
                    trajectory.add_step(result_step)
                    research_rounds += 1
                    
                elif step.step_type == StepType.FINAL_ANSWER:
                    break
                    
            except Exception as e:
                logger.error(f"Research error: {e}")
                error_step = TrajectoryStep(
                    step_type=StepType.THOUGHT,
                    content=f"Encountered an error: {str(e)}. Continuing with available information.",
                    metadata={"error": str(e), "phase": self.current_research_phase}
                )
                trajectory.add_step(error_step)
                break
        
        self.finalize_trajectory(trajectory)
        return trajectory
    
    def _parse_research_output(self, output: str, round_num: int) -> TrajectoryStep:
        """解析研究智能体的输出"""
        output = output.strip()
        
        if output.startswith("Thought:"):
            self.current_research_phase = "thinking"
            return TrajectoryStep(
                step_type=StepType.THOUGHT,
                content=output[8:].strip(),
                metadata={"phase": self.current_research_phase, "round": round_num}
            )
        elif output.startswith("Action:"):
            self.current_research_phase = "gathering"
            action_content = output[7:].strip()
            tool_name, tool_args = self._parse_tool_call(action_content)
            return TrajectoryStep(
                step_type=StepType.ACTION,
                content=action_content,
                tool_name=tool_name,
                tool_args=tool_args,
                metadata={"phase": self.current_research_phase, "round": round_num}
            )
        elif "conclusion" in output.lower() or "final answer" in output.lower():
            self.current_research_phase = "concluding"
            return TrajectoryStep(
                step_type=StepType.FINAL_ANSWER,
                content=output,
                metadata={"phase": self.current_research_phase, "round": round_num}
            )
        else:
            return TrajectoryStep(
                step_type=StepType.THOUGHT,
                content=output,
                metadata={"phase": self.current_research_phase, "round": round_num, "inferred": True}
            )
    
    def should_continue(self, trajectory: Trajectory) -> bool:
        """研究智能体的继续条件"""
        if not super().should_continue(trajectory):
            return False
        
        # 如果已经有足够的研究轮次，考虑结束
        action_steps = [s for s in trajectory.steps if s.step_type == StepType.ACTION]
        if len(action_steps) >= self.research_depth:
            return False
        
        return True
